"""The settings file and its command (infra/settings.py), run for real: `maskrcnn settings`
as a user types it, and app.py as the CDK CLI runs it (settings in CDK_CONTEXT_JSON)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from infra import settings
from infra.config import ConfigError

from cdk_synth import REPO_ROOT, cdk_json_context


def run_settings(*args: str, path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.settings", "--file", str(path), *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def test_set_stores_typed_values_and_show_reports_their_source(tmp_path):
    path = tmp_path / "settings.json"
    result = run_settings("set", "worker_count=3", "efa=true", "instance_type=p4d.24xlarge",
                          "availability_zones=us-east-1a,us-east-1d", path=path)
    assert result.returncode == 0, result.stderr
    # As JSON types, the way a user would write the file by hand.
    assert json.loads(path.read_text()) == {
        "instance_type": "p4d.24xlarge", "worker_count": 3, "efa": True,
        "availability_zones": ["us-east-1a", "us-east-1d"]}
    shown = json.loads(run_settings("show", "--json", path=path).stdout)
    assert shown["worker_count"] == {"value": 3, "source": "settings file"}
    assert shown["ebs_volume_size_gib"] == {"value": 200, "source": "default"}
    assert len(shown) == len(settings.SETTINGS)

    assert run_settings("unset", "efa", path=path).returncode == 0
    assert "efa" not in json.loads(path.read_text())


@pytest.mark.parametrize("args, words", [
    (["set", "worker_count=-1"], ["worker_count", "0 to 64"]),
    (["set", "worker_cout=2"], ["unknown setting", "worker_cout"]),
    (["set", "worker_count"], ["not key=value"]),
    # Each value alone is valid; together they are not (SSH needs a key pair).
    (["set", "ssh_cidr=203.0.113.7/32"], ["key_pair_name", "required when ssh_cidr"]),
])
def test_a_bad_setting_is_refused_with_one_line_and_the_file_is_untouched(tmp_path, args, words):
    path = tmp_path / "settings.json"
    assert run_settings("set", "worker_count=3", path=path).returncode == 0
    before = path.read_bytes()
    result = run_settings(*args, path=path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0]
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]   # no temporary file left


def test_a_broken_or_unknown_settings_file_is_named_in_the_error(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="settings.json is not valid JSON"):
        settings.load_config(path)
    path.write_text('{"workers": 3}')
    with pytest.raises(ConfigError, match="unknown setting 'workers'"):
        settings.load_config(path)


def test_cdk_reads_the_settings_file_and_a_dash_c_flag_overrides_it_for_one_command(tmp_path):
    """app.py as `cdk synth -c worker_count=2` runs it, with worker_count=3 in the file: the
    template has 2 workers and stderr says the override is for this command only."""
    path = tmp_path / "settings.json"
    settings.set_values(path, ["worker_count=3"])
    context = {**cdk_json_context(), "settings_file": str(path), "worker_count": "2"}
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(context),
           "CDK_OUTDIR": str(tmp_path / "cdk.out")}
    result = subprocess.run([sys.executable, "app.py"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert ("note: -c worker_count=2 overrides the settings file's 3 for this command only; "
            "keep it with `maskrcnn settings set worker_count=2`") in result.stderr
    template = json.loads((tmp_path / "cdk.out" / "EfsClusterStack.template.json").read_text())
    sizes = sorted(r["Properties"]["MaxSize"] for r in template["Resources"].values()
                   if r["Type"] == "AWS::AutoScaling::AutoScalingGroup")
    assert sizes == ["1", "2"]


def test_a_named_settings_file_that_does_not_exist_stops_cdk_before_any_stack(tmp_path):
    """`cdk deploy -c settings_file=prod.jsn` (a typo): read as "no file yet" it would mean all
    defaults, and the deploy would update the unprefixed stacks. app.py refuses it instead, with
    the path and the fix, and writes no template."""
    typo = tmp_path / "prod.jsn"
    context = {**cdk_json_context(), "settings_file": str(typo)}
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(context),
           "CDK_OUTDIR": str(tmp_path / "cdk.out")}
    result = subprocess.run([sys.executable, "app.py"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: settings file {typo} (named by -c settings_file={typo}) "
                               "does not exist"), lines[0]
    assert f"maskrcnn settings --file {typo} set" in lines[0]
    assert not list((tmp_path / "cdk.out").glob("*.template.json"))
    # A directory is no settings file either.
    with pytest.raises(ConfigError, match=f"settings file {tmp_path} .* is not a file"):
        settings.resolve({"settings_file": str(tmp_path)})


def test_a_named_file_must_exist_while_the_default_one_and_none_may_be_absent(tmp_path, monkeypatch):
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=f"settings file {missing} \\(named by --settings-file\\) "
                                          "does not exist"):
        settings.load_config(missing)
    monkeypatch.setattr(settings, "DEFAULT_PATH", tmp_path / "settings.json")
    assert settings.load_config() == settings.resolve({"settings_file": "none"}).config
    assert settings.resolve({}).path == tmp_path / "settings.json"
    # `settings set --file` is how a named file comes to exist.
    settings.set_values(missing, ["worker_count=2"])
    assert settings.load_config(missing).worker_count == 2
