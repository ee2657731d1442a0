"""Stacks: each composes constructs and wires grants between them; nothing else.
The card's stacks/ folder (see infra/__init__.py for why it lives under infra/)."""
