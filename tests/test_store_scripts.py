"""The store's composite Lua scripts: each is its parts' own text, then its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from teaagent.store._scripts import COMPOSITES, script_source


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_a_composite_script_is_its_parts_own_text_then_its_own(name: str) -> None:
    source = script_source(name)
    for part in COMPOSITES[name]:
        assert f"local function {part}(KEYS, ARGV)\n{script_source(part).rstrip()}\nend\n" in source
    assert source.endswith(
        (Path(__file__).parents[1] / f"libs/teaagent/store/lua/{name}.lua").read_text(encoding="utf-8")
    )


def test_withdrawing_and_settling_close_a_pending_request_with_one_part() -> None:
    assert COMPOSITES["withdraw"] == COMPOSITES["settle_elsewhere"] == ("close_pending",)
