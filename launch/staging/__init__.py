"""Data staging: download COCO 2017 + pretrained weights (download), upload them to the stack's
bucket and copy them from S3 to EFS (s3sync); commands in ``maskrcnn data``."""
