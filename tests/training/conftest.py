"""Fixtures for the trainer's tests.

``tf_session`` builds ops in a graph of their own (graph mode inside ``as_default()``) without
turning eager execution off for the whole pytest process, which other tests rely on.
"""
import pytest


@pytest.fixture
def tf_session():
    from training.compat import tf, tf1
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        yield tf, sess


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    """A small synthetic shapes dataset (12 training and 4 validation images of 96 px) for the
    trainer's end-to-end runs."""
    from training.data.synthetic import SyntheticSpec, generate
    out = tmp_path_factory.mktemp("tiny_shapes")
    generate(out, SyntheticSpec(train=12, val=4, size=96, max_object_size=48, seed=3))
    return out
