"""Datasets: the COCO-format reader, augmentation and the synthetic dataset generator."""
