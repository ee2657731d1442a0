"""The detector as a short pipeline: preprocess -> backbone -> (FPN) -> RPN -> box head -> mask head.

``MaskRCNN`` is a tensorpack ``ModelDesc``: ``inputs()`` declares what the input pipeline feeds,
``build_graph()`` returns the training loss (or, outside training, names the detection outputs),
``optimizer()`` holds the LR schedule. Faster R-CNN is ``MODE_MASK=False``; the C4 variant
(``MODE_FPN=False``) pools ROIs from res4 and runs res5 as the box head.
"""
from __future__ import annotations

from tensorpack import ModelDesc
from tensorpack.models import Conv2D, Conv2DTranspose
from tensorpack.tfutils.argscope import argscope
from tensorpack.tfutils.summary import add_moving_summary
from tensorpack.tfutils.tower import get_current_tower_context

from training.compat import tf, tf1
from training.model import box_ops, consistency, frcnn_head, losses, mask_head as mask_lib
from training.model.anchors import level_anchor_specs
from training.model.backbone import ResNet
from training.model.fpn import fpn
from training.model.roi_align import multilevel_roi_align, roi_align
from training.model.rpn import generate_proposals, multilevel_rpn

INPUT_NAMES_TRAIN = ("images", "image_hw", "gt_boxes", "gt_labels", "num_gt", "gt_masks",
                     "num_anchors", "anchor_index", "anchor_labels", "anchor_targets")
INPUT_NAMES_PREDICT = ("images", "image_hw")
# The predict graph takes a batch of images (zero-padded to one size, each with its real size in
# image_hw) and returns the detections of all of them, image after image: boxes, scores, labels and
# masks have one row per detection, and output/detections_per_image [B] says how many rows are
# each image's.
OUTPUT_NAMES = ("output/boxes", "output/scores", "output/labels", "output/masks", "output/detections_per_image")
FPN_ROI_STRIDES = (4, 8, 16, 32)


def learning_rate(cfg, global_step):
    """Linear warmup from WARMUP_INIT_LR, then the piecewise-constant schedule (see config.finalize)."""
    t = cfg.TRAIN
    step = tf.cast(global_step, tf.float32)
    values = [t.SCALED_LR * m for m in t.LR_MULTIPLIERS]
    # piecewise constant (values[k] after k boundaries are passed, as tf1.train.piecewise_constant),
    # without the host-side assert of piecewise_constant's tf.case
    passed = tf.reduce_sum(tf.cast(global_step > tf.constant([int(b) for b in t.LR_BOUNDARIES], global_step.dtype),
                                   tf.int32)) if t.LR_BOUNDARIES else 0
    lr = tf.gather(tf.constant(values, tf.float32), passed)
    if t.WARMUP_STEPS > 0:
        alpha = tf.minimum(step / float(t.WARMUP_STEPS), 1.0)
        lr = tf.where(step < t.WARMUP_STEPS, t.WARMUP_INIT_LR * (1 - alpha) + lr * alpha, lr)
    return lr


class MaskRCNN(ModelDesc):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.num_classes = cfg.DATA.NUM_CATEGORY
        self.stats = {}  # metric name -> tensor, printed by the progress logger
        # set by the trainer: wraps the optimizer so that it averages gradients over the ranks
        # (training/gradients.py); None when a single process builds its own training op
        self.allreduce = None

    # -------------------------------------------------------------------------------- inputs
    def inputs(self):
        return [
            tf.TensorSpec([None, None, None, 3], tf.uint8, "images"),          # BGR 0..255, zero-padded
            tf.TensorSpec([None, 2], tf.int32, "image_hw"),                     # real size before padding
            tf.TensorSpec([None, None, 4], tf.float32, "gt_boxes"),             # x1y1x2y2, padded per batch
            tf.TensorSpec([None, None], tf.int32, "gt_labels"),                 # 1..C, 0 = padding
            tf.TensorSpec([None], tf.int32, "num_gt"),
            tf.TensorSpec([None, None, None, None], tf.uint8, "gt_masks"),      # [B, G, H, W / 8], packed bits
            # the RPN's sampled anchors only (RPN.BATCH_PER_IM rows an image), not a label per anchor
            tf.TensorSpec([None], tf.int32, "num_anchors"),                     # the pipeline's anchors per image
            tf.TensorSpec([None, None], tf.int32, "anchor_index"),              # into all levels, [H, W, A] order
            tf.TensorSpec([None, None], tf.int32, "anchor_labels"),             # 1 fg, 0 bg, -1 padding row
            tf.TensorSpec([None, None, 4], tf.float32, "anchor_targets"),       # encoded boxes of fg rows
        ]

    # -------------------------------------------------------------------------------- graph
    def _preprocess(self, images):
        p = self.cfg.PREPROC
        # uint8 up to here: a quarter of float32's host memory, queue and host-to-device copy
        x = (tf.cast(images, tf.float32) - tf.constant(p.PIXEL_MEAN, tf.float32)) / tf.constant(p.PIXEL_STD, tf.float32)
        return tf.transpose(x, [0, 3, 1, 2]) if self.cfg.BACKBONE.DATA_FORMAT == "NCHW" else x

    def _to_nhwc(self, x):
        return tf.transpose(x, [0, 2, 3, 1]) if self.cfg.BACKBONE.DATA_FORMAT == "NCHW" else x

    def _features(self, images, image_hw):
        """RPN feature maps (one per anchor level) and the ROI pooling function."""
        cfg = self.cfg
        x = self._preprocess(images)
        self.backbone = ResNet.from_config(cfg)
        fmt = cfg.BACKBONE.DATA_FORMAT
        if cfg.MODE_FPN:
            c_feats = self.backbone(x, image_hw=image_hw)
            p_feats = fpn(c_feats, num_channel=cfg.FPN.NUM_CHANNEL, norm=cfg.FPN.NORM, data_format=fmt,
                          with_p6=64 in cfg.FPN.ANCHOR_STRIDES)
            rpn_feats = [p_feats[(4, 8, 16, 32, 64).index(s)] for s in cfg.FPN.ANCHOR_STRIDES]
            roi_feats = [self._to_nhwc(f) for f in p_feats[:4]]

            def pool(boxes, box_indices, size):
                return multilevel_roi_align(roi_feats, boxes, box_indices, output_size=size,
                                            canonical_size=cfg.FPN.ROI_CANONICAL_SIZE, strides=FPN_ROI_STRIDES)
        else:
            c4 = self.backbone(x, num_stages=3, image_hw=image_hw)[-1]
            rpn_feats = [c4]
            c4_nhwc = self._to_nhwc(c4)

            def pool(boxes, box_indices, size):
                return roi_align(c4_nhwc, boxes, box_indices, stride=cfg.RPN.ANCHOR_STRIDE, output_size=size)
        return rpn_feats, pool

    def _box_head(self, pool, rois, box_indices):
        cfg = self.cfg
        if cfg.MODE_FPN:
            pooled = pool(rois, box_indices, cfg.FRCNN.POOLED_SIZE)
            with _xla_scope(cfg):
                logits, deltas = frcnn_head.box_head(pooled, head_func=cfg.FPN.FRCNN_HEAD_FUNC,
                                                     fc_dim=cfg.FPN.FRCNN_FC_HEAD_DIM, conv_dim=cfg.FPN.FRCNN_CONV_HEAD_DIM,
                                                     num_classes=self.num_classes, gn_groups=cfg.BACKBONE.GN_GROUPS)
            return logits, deltas, None
        # C4: pool 2P x 2P from res4, run res5 (stride 2) as the head, global-average-pool
        pooled = pool(rois, box_indices, 2 * cfg.FRCNN.POOLED_SIZE)
        if cfg.BACKBONE.DATA_FORMAT == "NCHW":
            pooled = tf.transpose(pooled, [0, 3, 1, 2])
        res5 = self._to_nhwc(self.backbone.stage(pooled, 3))
        feat = tf.reduce_mean(res5, axis=[1, 2])
        with tf1.variable_scope("fastrcnn"):  # tensorpack's C4 names: fastrcnn/class, fastrcnn/box
            logits, deltas = frcnn_head.class_outputs(feat, num_classes=self.num_classes)
        return logits, deltas, res5

    def _mask_logits(self, pool, boxes, box_indices, res5=None):
        cfg = self.cfg
        if cfg.MODE_FPN:
            pooled = pool(boxes, box_indices, cfg.MRCNN.MASK_SIZE // 2)
            return mask_lib.mask_head(pooled, num_classes=self.num_classes, head_dim=cfg.MRCNN.HEAD_DIM,
                                      num_conv=cfg.MRCNN.NUM_CONV, use_gn=cfg.FPN.MRCNN_HEAD_FUNC.endswith("gn_head"),
                                      gn_groups=cfg.BACKBONE.GN_GROUPS)
        # C4: the res5 features of the same ROIs, upsampled 2x (14x14 masks)
        if res5 is None:  # inference: res5 again, on the final boxes, with the box head's weights
            pooled = pool(boxes, box_indices, 2 * cfg.FRCNN.POOLED_SIZE)
            if cfg.BACKBONE.DATA_FORMAT == "NCHW":
                pooled = tf.transpose(pooled, [0, 3, 1, 2])
            with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
                res5 = self._to_nhwc(self.backbone.stage(pooled, 3))
        with tf1.variable_scope("maskrcnn"), argscope([Conv2D, Conv2DTranspose], data_format="channels_last"):
            x = Conv2DTranspose("deconv", res5, cfg.MRCNN.HEAD_DIM, 2, strides=2, activation=tf.nn.relu)
            x = Conv2D("conv", x, self.num_classes, 1, kernel_initializer=tf1.random_normal_initializer(stddev=0.001))
        return tf.transpose(x, [0, 3, 1, 2])

    def build_graph(self, images, image_hw, gt_boxes, gt_labels, num_gt, gt_masks, num_anchors, anchor_index,
                    anchor_labels, anchor_targets):
        cfg = self.cfg
        training = get_current_tower_context().is_training
        with _xla_scope(cfg):
            rpn_feats, pool = self._features(images, image_hw)
            logits_l, deltas_l, anchors_l = multilevel_rpn(rpn_feats, cfg=cfg, data_format=cfg.BACKBONE.DATA_FORMAT)
        if not training:
            return self._inference(pool, logits_l, deltas_l, anchors_l, image_hw)
        batch = cfg.TRAIN.BATCH_SIZE_PER_GPU
        proposals, _, num_proposals = generate_proposals(logits_l, deltas_l, anchors_l, image_hw, cfg=cfg,
                                                         training=training)

        # ---- RPN losses over all images and levels (with TRAIN.DEBUG_CHECKS, once the labels are checked to line up)
        if cfg.TRAIN.DEBUG_CHECKS:
            specs = level_anchor_specs(cfg)
            anchor_index, anchor_labels, anchor_targets = consistency.checked_anchor_targets(
                num_anchors, anchor_index, anchor_labels, anchor_targets, logits_l, tf.shape(images)[1:3],
                specs=specs, anchors_per_cell=len(specs[0][1]) * len(cfg.RPN.ANCHOR_RATIOS), fpn=cfg.MODE_FPN)
        rpn_label_loss, rpn_box_loss = losses.sampled_rpn_losses(
            anchor_index, anchor_labels, anchor_targets, tf.concat(logits_l, axis=1), tf.concat(deltas_l, axis=1),
            batch_per_im=cfg.RPN.BATCH_PER_IM)

        # ---- sample ROIs per image; gather foreground ROIs for the box regression and the mask head
        max_gt = tf.shape(gt_boxes)[1]
        rois, roi_img, labels, fg_pos, fg_rois, fg_img, fg_labels, fg_mask_index, fg_box_targets = ([] for _ in range(9))
        offset = 0
        for i in range(batch):
            gtb = gt_boxes[i, :num_gt[i]]
            gtl = gt_labels[i, :num_gt[i]]
            r, lab, fg_gt, num_fg = frcnn_head.sample_rois(
                proposals[i], gtb, gtl, batch_per_im=cfg.FRCNN.BATCH_PER_IM, fg_ratio=cfg.FRCNN.FG_RATIO,
                fg_thresh=cfg.FRCNN.FG_THRESH, num_proposals=num_proposals[i])
            if cfg.TRAIN.DEBUG_CHECKS:
                r, lab, fg_gt = consistency.checked_sampled_rois(
                    r, lab, fg_gt, num_fg, batch_per_im=cfg.FRCNN.BATCH_PER_IM, fg_ratio=cfg.FRCNN.FG_RATIO, image=i)
            rois.append(r)
            labels.append(lab)
            roi_img.append(tf.fill([tf.shape(r)[0]], i))
            fg_pos.append(offset + tf.range(num_fg))
            fg_rois.append(r[:num_fg])
            fg_img.append(tf.fill([num_fg], i))
            fg_labels.append(lab[:num_fg])
            fg_mask_index.append(i * max_gt + fg_gt)
            fg_box_targets.append(frcnn_head.box_targets(r, gtb, fg_gt, num_fg, cfg.FRCNN.BBOX_REG_WEIGHTS))
            offset = offset + tf.shape(r)[0]
        cat = lambda xs: tf.concat(xs, axis=0)  # noqa: E731
        rois, roi_img, labels, fg_pos = cat(rois), cat(roi_img), cat(labels), cat(fg_pos)
        fg_rois, fg_img, fg_labels, fg_mask_index, fg_box_targets = (
            cat(fg_rois), cat(fg_img), cat(fg_labels), cat(fg_mask_index), cat(fg_box_targets))

        logits, deltas, res5 = self._box_head(pool, rois, roi_img)
        fg_deltas = tf.gather_nd(deltas, tf.stack([fg_pos, fg_labels - 1], axis=1))
        label_loss, box_loss, stats = losses.fastrcnn_losses(labels, logits, fg_box_targets, fg_deltas,
                                                             roi_image=roi_img, fg_image=fg_img, num_images=batch)
        named = {"rpn_losses/label_loss": rpn_label_loss, "rpn_losses/box_loss": rpn_box_loss,
                 "fastrcnn_losses/label_loss": label_loss, "fastrcnn_losses/box_loss": box_loss, **stats}
        total = rpn_label_loss + rpn_box_loss + label_loss + box_loss

        if cfg.MODE_MASK:
            res5_fg = tf.gather(res5, fg_pos) if res5 is not None else None
            mask_logits = self._mask_logits(pool, fg_rois, fg_img, res5_fg)
            shp = tf.shape(gt_masks)  # packed 8 pixels a byte; mask_targets reads the bits it samples
            flat_masks = tf.reshape(gt_masks, [shp[0] * shp[1], shp[2], shp[3]])
            size = mask_logits.shape[-1] or cfg.MRCNN.MASK_SIZE
            targets = mask_lib.mask_targets(flat_masks, fg_mask_index, fg_rois, size=int(size))
            if cfg.TRAIN.DEBUG_CHECKS:
                mask_logits, targets = consistency.checked_mask_targets(mask_logits, targets, fg_labels,
                                                                        num_classes=self.num_classes)
            mask_loss, mstats = losses.maskrcnn_loss(mask_logits, fg_labels, targets)
            named.update({"maskrcnn_loss/maskrcnn_loss": mask_loss, **mstats})
            total = total + mask_loss

        kernels = [v for v in tf1.trainable_variables() if v.name.endswith("/W:0")]
        wd = tf.multiply(cfg.TRAIN.WEIGHT_DECAY, tf.add_n([tf.nn.l2_loss(v) for v in kernels]), name="wd_cost")
        total = tf.add(total, wd, name="total_cost")
        named.update({"wd_cost": wd, "total_cost": total})
        add_moving_summary(*[tf.identity(v, name=k.replace("/", "_")) for k, v in named.items()])
        self.stats = named
        return total

    def _inference(self, pool, logits_l, deltas_l, anchors_l, image_hw):
        """Detections of a batch of any size: proposals and final boxes per image (each clipped to
        and suppressed within its own image), the box and mask heads once on every image's ROIs."""
        cfg = self.cfg
        num_images = tf.shape(image_hw)[0]
        padded, _, proposal_counts = generate_proposals(logits_l, deltas_l, anchors_l, image_hw, cfg=cfg,
                                                        training=False)
        # each image's proposals, image after image
        proposals = tf.boolean_mask(padded, tf.range(tf.shape(padded)[1])[None, :] < proposal_counts[:, None])
        proposal_image = tf.repeat(tf.range(num_images), proposal_counts)
        logits, deltas, _ = self._box_head(pool, proposals, proposal_image)
        starts = tf.cumsum(proposal_counts, exclusive=True)

        def detections_of(i):
            rows = tf.range(starts[i], starts[i] + proposal_counts[i])
            return frcnn_head.detections(
                tf.gather(proposals, rows), tf.gather(logits, rows), tf.gather(deltas, rows), image_hw[i],
                weights=cfg.FRCNN.BBOX_REG_WEIGHTS, score_thresh=cfg.TEST.RESULT_SCORE_THRESH,
                nms_thresh=cfg.TEST.FRCNN_NMS_THRESH, max_dets=cfg.TEST.RESULTS_PER_IM,
                decode_clip=box_ops.decode_clip(cfg.PREPROC.MAX_SIZE))

        (boxes, scores, labels), counts = _per_image(num_images, detections_of, [tf.float32, tf.float32, tf.int32])
        boxes.set_shape([None, 4])
        scores.set_shape([None])
        labels.set_shape([None])
        tf.identity(boxes, name="output/boxes")
        tf.identity(scores, name="output/scores")
        tf.identity(labels, name="output/labels")
        tf.identity(counts, name="output/detections_per_image")
        if cfg.MODE_MASK:
            mask_logits = self._mask_logits(pool, boxes, tf.repeat(tf.range(num_images), counts))
            idx = tf.stack([tf.range(tf.shape(labels)[0]), labels - 1], axis=1)
            tf.sigmoid(tf.gather_nd(mask_logits, idx), name="output/masks")
        else:
            tf.zeros([tf.shape(boxes)[0], 1, 1], name="output/masks")
        return None

    # -------------------------------------------------------------------------------- optimizer
    def optimizer(self):
        from training.gradients import build_optimizer
        cfg = self.cfg
        lr = tf.identity(learning_rate(cfg, tf1.train.get_or_create_global_step()), name="learning_rate")
        tf1.summary.scalar("learning_rate", lr)
        return build_optimizer(tf1.train.MomentumOptimizer(lr, cfg.TRAIN.MOMENTUM), clip=cfg.TRAIN.GRADIENT_CLIP,
                               allreduce=self.allreduce, mixed_precision=cfg.TRAIN.MIXED_PRECISION and _has_gpu())


def _per_image(num_images, fn, dtypes):
    """``fn(i)`` for every image ``i`` of the batch (a tensor count): each returns tensors whose first
    axes have one length K_i. Returns their concatenations over the images, in image order, and K [B].
    A graph loop, so one graph serves every batch size."""
    arrays = [tf.TensorArray(d, size=num_images, infer_shape=False) for d in dtypes]
    counts = tf.TensorArray(tf.int32, size=num_images)

    def body(i, counts, *arrays):
        outputs = fn(i)
        arrays = [a.write(i, o) for a, o in zip(arrays, outputs)]
        return (i + 1, counts.write(i, tf.shape(outputs[0])[0]), *arrays)

    _, counts, *arrays = tf.while_loop(lambda i, *_: i < num_images, body, [tf.constant(0), counts, *arrays])
    return [a.concat() for a in arrays], counts.stack()


def _xla_scope(cfg):
    """XLA for the training tower's parts of static shape, when TRAIN.XLA is on a GPU: the backbone,
    FPN and RPN head (TRAIN.XLA pads every batch to one of four shapes: data/examples.py, batch_padded_size)
    and the box head (BATCH_PER_IM rows an image whenever there are enough proposals, always in
    practice). Not ROI pooling or the mask head (rows = foreground ROIs, a new count almost every
    step: a recompilation each), and never the evaluation tower (any image size, any detections)."""
    import contextlib
    if cfg.TRAIN.XLA and _has_gpu() and get_current_tower_context().is_training:
        return tf1.xla.experimental.jit_scope(compile_ops=True, separate_compiled_gradients=True)
    return contextlib.nullcontext()


def _has_gpu() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))
