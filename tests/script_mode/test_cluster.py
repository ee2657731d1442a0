"""Parameter-server layouts and TF_CONFIG: local processes and SageMaker instances (as in SageMaker's
script-mode example with parameter server and Horovod)."""
import json

import pytest

from script_mode import cluster as cl
from script_mode import sagemaker_ps


def test_local_cluster_has_chief_workers_ps_on_distinct_ports():
    c = cl.local_cluster(workers=2, ps=1)
    assert {k: len(v) for k, v in c.items()} == {"chief": 1, "worker": 2, "ps": 1}
    addresses = [a for v in c.values() for a in v]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)
    config = json.loads(cl.tf_config(c, cl.Task("worker", 1)))
    assert config == {"cluster": c, "task": {"type": "worker", "index": 1}}
    with pytest.raises(ValueError, match="not in the cluster"):
        cl.tf_config(c, cl.Task("worker", 2))


@pytest.mark.parametrize("workers, ps, message", [(2, 0, "at least 1 parameter server"),
                                                  (0, 1, "at least 1 worker")])
def test_counts_the_strategy_cannot_use(workers, ps, message):
    with pytest.raises(ValueError, match=message):
        cl.local_cluster(workers, ps)


def test_sagemaker_layout_follows_the_seed():
    """N instances: a ps on each, the chief on the first, workers on the other N-1."""
    hosts = ["algo-1", "algo-2", "algo-3"]
    c, tasks = cl.sagemaker_cluster(hosts, "algo-1")
    assert c == {"chief": ["algo-1:2222"], "worker": ["algo-2:2222", "algo-3:2222"],
                 "ps": ["algo-1:2223", "algo-2:2223", "algo-3:2223"]}
    assert tasks == [cl.Task("ps", 0), cl.Task("chief", 0)]
    assert cl.sagemaker_cluster(hosts, "algo-3")[1] == [cl.Task("ps", 2), cl.Task("worker", 1)]
    with pytest.raises(ValueError, match="at least 2 instances"):
        cl.sagemaker_cluster(["algo-1"], "algo-1")
    with pytest.raises(ValueError, match="not in the host list"):
        cl.sagemaker_cluster(hosts, "algo-9")


def test_sagemaker_master_becomes_chief():
    """SageMaker's TensorFlow containers still call the coordinator `master` (TF1)."""
    legacy = {"cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"],
                          "worker": ["algo-2:2222"]},
              "environment": "cloud", "task": {"index": 0, "type": "master"}}
    assert cl.normalize(legacy) == {
        "cluster": {"chief": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"],
                    "worker": ["algo-2:2222"]},
        "task": {"index": 0, "type": "chief"}}


def test_sagemaker_entry_refuses_to_run_outside_a_job_or_on_one_instance(capsys):
    assert sagemaker_ps.main([], environ={}) == 2
    assert "SM_HOSTS" in capsys.readouterr().err
    assert sagemaker_ps.main([], environ={"SM_HOSTS": '["algo-1"]',
                                          "SM_CURRENT_HOST": "algo-1"}) == 2
    assert "at least 2 instances" in capsys.readouterr().err
