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
