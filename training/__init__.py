"""Distributed Mask R-CNN / Faster R-CNN trainer (TensorFlow graph mode, tensorpack, Horovod)."""
