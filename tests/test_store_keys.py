"""Key names: one module spells them, every script's keys share one Redis Cluster slot."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from teaagent.store import REQUEST_RETENTION_SECONDS, Keys, node_prefix

REQUEST_ID = "0123456789abcdef0123456789abcdef"


def slot(key: str) -> int:
    return int(key_slot(key.encode()))


def test_node_prefix_is_ta_and_the_agent_id() -> None:
    assert node_prefix("alpha") == "ta:alpha"
    assert node_prefix("node-2.b_c") == "ta:node-2.b_c"


@pytest.mark.parametrize("agent_id", ["", "Alpha", "-alpha", "al{pha}", "a" * 65, "al pha"])
def test_node_prefix_refuses_a_malformed_agent_id(agent_id: str) -> None:
    with pytest.raises(ValueError, match="is not valid"):
        node_prefix(agent_id)


@pytest.mark.parametrize("prefix", ["", "ta:{alpha}", "ta:al*", "ta alpha", ":ta", "ta:a?"])
def test_keys_refuse_a_prefix_with_tags_globs_or_spaces(prefix: str) -> None:
    with pytest.raises(ValueError, match=r"key prefix .* is not valid"):
        Keys(prefix)


def test_request_keys_carry_the_request_id_as_their_only_hash_tag() -> None:
    keys = Keys("ta:alpha").request(REQUEST_ID)
    assert keys.all() == (
        f"ta:alpha:req:{{{REQUEST_ID}}}:doc",
        f"ta:alpha:req:{{{REQUEST_ID}}}:outcome",
        f"ta:alpha:req:{{{REQUEST_ID}}}:decisions",
        f"ta:alpha:req:{{{REQUEST_ID}}}:events",
        f"ta:alpha:req:{{{REQUEST_ID}}}:deliveries",
    )
    assert {slot(key) for key in keys.all()} == {slot(REQUEST_ID)}


def test_two_requests_usually_land_in_different_slots() -> None:
    keys = Keys("ta:alpha")
    slots = {slot(keys.request(f"{index:032x}").doc) for index in range(50)}
    assert len(slots) > 40  # requests spread over the cluster instead of pinning a node to one slot


def test_inbox_keys_are_tagged_by_origin_and_id_and_differ_from_own_requests() -> None:
    keys = Keys("ta:beta")
    inbox = keys.inbox_item("alpha", REQUEST_ID)
    assert inbox.doc == f"ta:beta:in:{{alpha/{REQUEST_ID}}}:doc"
    assert len({slot(key) for key in inbox.all()}) == 1
    assert keys.inbox_item("gamma", REQUEST_ID).doc != inbox.doc
    assert keys.request(REQUEST_ID).doc != inbox.doc


def test_queue_keys_share_a_tag_that_names_the_prefix() -> None:
    queue = Keys("ta:alpha").queue("deliveries")
    assert queue.stream == "ta:alpha:q:{ta:alpha/deliveries}:stream"
    assert len({slot(queue.stream), slot(queue.schedule), slot(queue.dead)}) == 1
    assert slot(Keys("ta:beta").queue("deliveries").stream) != slot(queue.stream)


def test_an_origins_held_set_is_tagged_by_the_prefix_and_origin_alone() -> None:
    keys = Keys("ta:beta")
    held = keys.inbox_held("alpha")
    assert held == "ta:beta:in:held:{ta:beta/alpha}"
    assert held not in {keys.inbox_pending(), keys.inbox_index(), keys.inbox_item("alpha", REQUEST_ID).doc}
    assert slot(keys.inbox_held("gamma")) != slot(held)
    with pytest.raises(ValueError, match="not a valid agent id"):
        keys.inbox_held("Alpha}")


def test_ratelimit_key_tags_the_scope() -> None:
    assert Keys("ta:alpha").ratelimit("tool:shell.run") == "ta:alpha:gcra:{tool:shell.run}"


@pytest.mark.parametrize("scope", ["", "a{b", "a}b", "x" * 257])
def test_ratelimit_key_refuses_an_empty_long_or_braced_scope(scope: str) -> None:
    with pytest.raises(ValueError, match="rate-limit scope"):
        Keys("ta:alpha").ratelimit(scope)


def test_a_charge_mark_sits_in_its_windows_slot_under_the_requests_ref() -> None:
    keys = Keys("ta:alpha")
    mark = keys.ratelimit_charged("origin:beta", f"beta/{REQUEST_ID}")
    assert mark == f"ta:alpha:gcra:{{origin:beta}}:charged:beta/{REQUEST_ID}"
    assert mark.startswith(keys.ratelimit("origin:beta"))  # the first {...}: the window's hash tag


@pytest.mark.parametrize(("scope", "ref"), [("origin:beta", ""), ("origin:beta", "b{x}"), ("a{b", "beta/x")])
def test_a_charge_mark_refuses_an_empty_or_braced_ref_or_a_bad_scope(scope: str, ref: str) -> None:
    with pytest.raises(ValueError, match=r"rate-limit scope|charged request's ref"):
        Keys("ta:alpha").ratelimit_charged(scope, ref)


@pytest.mark.parametrize(
    "request_id",
    ["", "0123456789ABCDEF0123456789ABCDEF", "0123456789abcdef0123456789abcde", "}" * 32, REQUEST_ID + "0"],
)
def test_request_keys_refuse_an_id_that_is_not_32_lowercase_hex(request_id: str) -> None:
    with pytest.raises(ValueError, match="is not 32 lowercase hex characters"):
        Keys("ta:alpha").request(request_id)


def test_inbox_keys_refuse_a_malformed_origin() -> None:
    with pytest.raises(ValueError, match="origin 'Al/pha' is not a valid agent id"):
        Keys("ta:beta").inbox_item("Al/pha", REQUEST_ID)


@pytest.mark.parametrize("name", ["", "Deliveries", "a b", "x" * 33])
def test_queue_names_are_short_lowercase_words(name: str) -> None:
    with pytest.raises(ValueError, match="queue name"):
        Keys("ta:alpha").queue(name)


def test_retention_outlives_the_longest_sensible_request() -> None:
    assert REQUEST_RETENTION_SECONDS >= 3600


def test_the_pending_sets_sit_beside_the_indexes_and_never_match_a_request_key() -> None:
    keys = Keys("ta:beta")
    assert (keys.request_pending(), keys.inbox_pending()) == ("ta:beta:req:pending", "ta:beta:in:pending")
    assert {keys.request_pending(), keys.inbox_pending()}.isdisjoint(
        {keys.request_index(), keys.inbox_index()}
    )
    # A request's keys always carry a {tag}; these never do, so no request id can name them.
    assert "{" not in keys.request_pending() + keys.inbox_pending()
