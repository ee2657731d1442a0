"""Mask R-CNN / Faster R-CNN, one module per part; `generalized_rcnn` composes them."""
