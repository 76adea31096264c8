"""The page's framework list is the registry's training flavours (no browser needed): a flavour registered in
planner/flavours/ but missing from index.html could be planned over HTTP and not from the page (a100 added
megatron-lm-2021 and the page's list stayed at three)."""

from __future__ import annotations

import re
from pathlib import Path

from planner import flavours

INDEX = Path(__file__).resolve().parents[2] / "frontend" / "index.html"


def test_framework_options_are_the_registered_training_flavours():
    select = re.search(r'<select id="framework"[^>]*>(.*?)</select>', INDEX.read_text(), re.S)
    assert select, "index.html has no framework select"
    options = re.findall(r'<option value="([\w.-]+)"', select.group(1))
    assert len(options) == len(set(options))
    assert set(options) == set(flavours.names("training")), set(options) ^ set(flavours.names("training"))
    assert options[0] == flavours.DEFAULT  # the page's first choice is the service's default
