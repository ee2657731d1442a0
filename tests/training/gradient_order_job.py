"""Run under ``horovodrun -np 2``: one step of a variable whose gradient is 1e-8 on every rank, through
training/gradients.py's chain (fp16 allreduce inside loss scaling) and through the other order (the
loss-scale optimizer's unscaled output, then the fp16 allreduce). Prints one JSON line per rank."""
import json

import horovod.tensorflow as hvd

from training.compat import tf1, use_graph_mode
from training.gradients import build_optimizer, horovod_allreduce

TINY = 1e-8

use_graph_mode()
hvd.init()
with tf1.Graph().as_default() as graph:
    inside_var = tf1.get_variable("inside", [], initializer=tf1.zeros_initializer())
    opt = build_optimizer(tf1.train.GradientDescentOptimizer(1.0), allreduce=horovod_allreduce(compression=True),
                          mixed_precision=True)
    (inside_grad, _), = opt.compute_gradients(TINY * inside_var, var_list=[inside_var])
    step = opt.apply_gradients([(inside_grad, inside_var)])

    after_var = tf1.get_variable("after", [], initializer=tf1.zeros_initializer())
    plain = build_optimizer(tf1.train.GradientDescentOptimizer(1.0), mixed_precision=True)
    (unscaled, _), = plain.compute_gradients(TINY * after_var, var_list=[after_var])
    after_grad = hvd.allreduce(unscaled, op=hvd.Average, compression=hvd.Compression.fp16)

    with tf1.Session(graph=graph) as sess:
        sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
        g_inside, _, g_after = sess.run([inside_grad, step, after_grad])
        print(json.dumps({"rank": hvd.rank(), "size": hvd.size(),
                          "inside": float(g_inside), "inside_var": float(sess.run(inside_var)),
                          "after": float(g_after)}), flush=True)
