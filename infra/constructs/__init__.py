"""Reusable constructs: one resource group each, typed keyword-only arguments, secure defaults.
The card's constructs/ folder (see infra/__init__.py for why it lives under infra/)."""
