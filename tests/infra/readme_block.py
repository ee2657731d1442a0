"""The README's deploy block (the steps of "Deploy, train, monitor, tear down") as commands, for the tests that
replay it (test_readme_deploy.py: every line against moto; test_infra_redeploy.py: step 1's
templates)."""
from __future__ import annotations

import re
import shlex

from cdk_synth import REPO_ROOT


def readme_commands() -> list[tuple[str, list[str]]]:
    """(step heading, argv) of each command of the README's deploy block: comments dropped,
    continuation lines joined, `a && b` split."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("## Deploy, train, monitor, tear down"):]
    # The section's first block is the client install (tests/test_client_install.py runs it).
    block = section[section.index("```bash\n# 1. ") + len("```bash"):]
    block = re.sub(r"\\\n\s*", " ", block[:block.index("```")])
    commands, step = [], ""
    for line in block.splitlines():
        if m := re.match(r"#\s*(\d\w?)\. ", line.strip()):
            step = m.group(1)
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            commands.append((step, words[:cut]))
            words = words[cut + 1:]
    return commands
