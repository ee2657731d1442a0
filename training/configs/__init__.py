"""Named config presets: lists of KEY=VALUE overrides on top of training/config.py's defaults."""
