"""Name scopes of the graph's coordinate and loss arithmetic, which must stay float32.

Under ``TRAIN.MIXED_PRECISION`` TensorFlow's AMP graph rewrite runs convolutions and matmuls in
float16. Box coordinates reach thousands of pixels with sub-pixel deltas (float16 has 11 bits of
mantissa: steps of 0.5 px above 1024), and losses are sums of many small terms, so everything
under these scopes is kept float32; ``training.amp_check`` runs the real rewrite on the training
graph and fails on any float16 node under them. The model opens the scopes by these names.
"""
from __future__ import annotations

ANCHORS = "anchors"              # grid anchors per level
BOX_ENCODE = "box_encode"        # regression targets from boxes and anchors / ROIs
BOX_DECODE = "box_decode"        # boxes from predicted deltas (proposals, detections)
PROPOSALS = "rpn_proposals"      # clip, size filter, NMS and top-k of the RPN's boxes
ROI_SAMPLING = "sample_rois"     # IoU matching of proposals to ground truth
ROI_BOXES = "roi_boxes"          # FPN level assignment and crop_and_resize sampling boxes
MASK_TARGETS = "mask_targets"    # ground-truth mask crops per foreground ROI
RPN_LOSSES, FASTRCNN_LOSSES, MASK_LOSS = "rpn_losses", "fastrcnn_losses", "maskrcnn_loss"  # metric name prefixes too
LOSSES = (RPN_LOSSES, FASTRCNN_LOSSES, MASK_LOSS)

FLOAT32 = (ANCHORS, BOX_ENCODE, BOX_DECODE, PROPOSALS, ROI_SAMPLING, ROI_BOXES, MASK_TARGETS) + LOSSES
