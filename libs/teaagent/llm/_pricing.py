"""What model calls cost: the vendored price table, the operator's override file, the preflight estimate.

Prices are US dollars per 1,000 tokens; estimates are in cents. The table ships inside the package
(``prices.json``, read with :mod:`importlib.resources`, never from the network). An operator prices
a model the table does not know, or corrects a price, with a file of the same shape named by
``TEAAGENT_PRICES_FILE``; its entries win over the vendored ones. The file is read again whenever it
changes on disk.

A model neither file lists is charged at its provider's default rate, which the vendored table sets
to the highest rate it lists for that provider, so that a cost cap is never under-counted because a
model is new.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from teaagent._files import FileSentences, read_limited
from teaagent.errors import ConfigError
from teaagent.llm._providers import PROVIDER_CONFIGS, require_provider

__all__ = [
    "PRICES_FILE_ENV",
    "PRICE_FILE_FORMAT",
    "PRICE_UNIT",
    "PROVIDER_COST_PER_1K_INPUT",
    "PROVIDER_COST_PER_1K_OUTPUT",
    "ModelPrice",
    "estimate_cost_preflight",
    "price_for",
]

PRICES_FILE_ENV = "TEAAGENT_PRICES_FILE"
PRICE_FILE_FORMAT = 1
# Written into every price file so that a table in dollars per million tokens is refused, not
# silently read a thousand times too cheap.
PRICE_UNIT = "USD per 1000 tokens"
MAX_PRICE_FILE_BYTES = 1024 * 1024  # a price list, not a data set
_CENTS_PER_DOLLAR = 100
_TOKENS_PER_PRICE_UNIT = 1000
_INFORMATIONAL_KEYS = frozenset({"as_of", "source", "note"})
# A dated snapshot ("gpt-4.1-2025-04-14", "claude-sonnet-4-5-20250929") or a moving alias
# ("claude-3-7-sonnet-latest") is priced as the model it names.
_SNAPSHOT_SUFFIX = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


@dataclass(frozen=True)
class ModelPrice:
    """The list price of one model, in US dollars per 1,000 tokens.

    Attributes:
        input_per_1k: Dollars per 1,000 prompt tokens.
        output_per_1k: Dollars per 1,000 generated tokens.
    """

    input_per_1k: float
    output_per_1k: float


@dataclass(frozen=True)
class _PriceTable:
    defaults: dict[str, ModelPrice]
    models: dict[str, dict[str, ModelPrice]]


def _parse_price(where: str, value: object) -> ModelPrice:
    if not isinstance(value, dict) or set(value) != {"input", "output"}:
        raise ConfigError(f"{where} must be an object with exactly the keys 'input' and 'output'.")
    rates: list[float] = []
    for key in ("input", "output"):
        rate = value[key]
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate < 0:
            raise ConfigError(f"{where}.{key} must be a finite number of dollars >= 0, not {rate!r}.")
        rates.append(float(rate))
    return ModelPrice(input_per_1k=rates[0], output_per_1k=rates[1])


def _parse_table(source: str, document: object) -> _PriceTable:
    """Check one price file's shape and return its prices; each mistake is a ConfigError naming ``source``."""
    if not isinstance(document, dict):
        raise ConfigError(f"The price file {source} must hold a JSON object.")
    unknown = set(document) - {"format", "unit", "providers"} - _INFORMATIONAL_KEYS
    if unknown:
        raise ConfigError(f"The price file {source} has unknown keys: {', '.join(sorted(unknown))}.")
    if document.get("format") != PRICE_FILE_FORMAT:
        raise ConfigError(f'The price file {source} must say "format": {PRICE_FILE_FORMAT}.')
    if document.get("unit") != PRICE_UNIT:
        raise ConfigError(f'The price file {source} must say "unit": "{PRICE_UNIT}".')
    providers = document.get("providers")
    if not isinstance(providers, dict):
        raise ConfigError(f'The price file {source} must have a "providers" object.')
    defaults: dict[str, ModelPrice] = {}
    models: dict[str, dict[str, ModelPrice]] = {}
    for provider, entry in providers.items():
        if provider not in PROVIDER_CONFIGS:
            raise ConfigError(f"The price file {source} prices an unknown provider {provider!r}.")
        if not isinstance(entry, dict) or not set(entry) <= {"default", "models"}:
            raise ConfigError(
                f"The price file {source}: providers.{provider} may hold only 'default' and 'models'."
            )
        if "default" in entry:
            defaults[provider] = _parse_price(f"{source}: providers.{provider}.default", entry["default"])
        listed = entry.get("models", {})
        if not isinstance(listed, dict):
            raise ConfigError(f"The price file {source}: providers.{provider}.models must be an object.")
        models[provider] = {
            name: _parse_price(f"{source}: providers.{provider}.models.{name}", price)
            for name, price in listed.items()
        }
    return _PriceTable(defaults=defaults, models=models)


def _read_override(path: Path) -> _PriceTable:
    raw = read_limited(
        path, MAX_PRICE_FILE_BYTES, FileSentences.named("The price file", path, MAX_PRICE_FILE_BYTES)
    )
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"The price file {path} is not valid JSON: {exc}.") from exc
    return _parse_table(str(path), document)


def _load_vendored() -> _PriceTable:
    text = resources.files("teaagent.llm").joinpath("prices.json").read_text(encoding="utf-8")
    return _parse_table("prices.json (vendored)", json.loads(text))


_VENDORED = _load_vendored()
_missing_defaults = sorted(set(PROVIDER_CONFIGS) - set(_VENDORED.defaults))
if _missing_defaults:  # pragma: no cover - a packaging mistake the test suite also checks
    raise ImportError(f"prices.json has no default rate for: {', '.join(_missing_defaults)}")

#: Dollars per 1,000 input tokens charged for a model the price tables do not list, by provider.
PROVIDER_COST_PER_1K_INPUT: dict[str, float] = {
    name: price.input_per_1k for name, price in _VENDORED.defaults.items()
}
#: Dollars per 1,000 output tokens charged for a model the price tables do not list, by provider.
PROVIDER_COST_PER_1K_OUTPUT: dict[str, float] = {
    name: price.output_per_1k for name, price in _VENDORED.defaults.items()
}

_override_lock = threading.Lock()
_override_cache: tuple[tuple[str, int, int], _PriceTable] | None = None


def _current_override() -> _PriceTable | None:
    """Return the override file's table, reading it again only when its path, size or mtime changed."""
    global _override_cache
    name = os.environ.get(PRICES_FILE_ENV, "").strip()
    if not name:
        return None
    path = Path(name)
    try:
        stat = path.stat()
    except OSError as exc:
        reason = exc.strerror or exc
        raise ConfigError(f"{PRICES_FILE_ENV} names {path}, which cannot be read: {reason}.") from exc
    stamp = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    with _override_lock:
        if _override_cache is not None and _override_cache[0] == stamp:
            return _override_cache[1]
        table = _read_override(path)
        _override_cache = (stamp, table)
        return table


def _lookup(models: dict[str, ModelPrice], model: str) -> ModelPrice | None:
    price = models.get(model)
    if price is None:
        base = _SNAPSHOT_SUFFIX.sub("", model)
        price = models.get(base) if base != model else None
    return price


def price_for(provider: str, model: str) -> ModelPrice:
    """Return what ``model`` of ``provider`` costs per 1,000 tokens.

    The first of these that prices the model wins: the ``TEAAGENT_PRICES_FILE`` override's entry,
    the vendored table's entry (a dated snapshot or ``-latest`` alias is priced as the model it
    names), the override's provider ``default``, then :data:`PROVIDER_COST_PER_1K_INPUT` and
    :data:`PROVIDER_COST_PER_1K_OUTPUT`.

    Args:
        provider: A provider name from :func:`available_providers`.
        model: The model name sent to the provider.

    Returns:
        The model's price.

    Raises:
        ValueError: ``provider`` is not configured.
        ConfigError: ``TEAAGENT_PRICES_FILE`` is set and its file cannot be read or is malformed.
    """
    require_provider(provider)
    override = _current_override()
    if override is not None:
        price = _lookup(override.models.get(provider, {}), model)
        if price is not None:
            return price
    price = _lookup(_VENDORED.models.get(provider, {}), model)
    if price is not None:
        return price
    if override is not None and provider in override.defaults:
        return override.defaults[provider]
    try:
        return ModelPrice(
            input_per_1k=PROVIDER_COST_PER_1K_INPUT[provider],
            output_per_1k=PROVIDER_COST_PER_1K_OUTPUT[provider],
        )
    except KeyError:
        # A provider added to PROVIDER_CONFIGS at run time without a rate: refuse rather than call it free.
        message = f"The LLM provider {provider!r} has no price; give it one in {PRICES_FILE_ENV}."
        raise ValueError(message) from None


def _require_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}.")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, not {value}.")
    return value


def estimate_cost_preflight(
    provider: str,
    model: str,
    prompt_tokens: int,
    max_output_tokens: int,
) -> dict[str, float]:
    """Estimate the most a model call can cost, before making it.

    The output is charged as if the model wrote all ``max_output_tokens``: the estimate is an upper
    bound, which is what a cost cap needs.

    Args:
        provider: A provider name from :func:`available_providers`.
        model: The model name sent to the provider.
        prompt_tokens: Tokens in the prompt (an estimate is fine).
        max_output_tokens: The most tokens the call may generate.

    Returns:
        ``{"input_cost_cents", "max_output_cost_cents", "total_max_cents"}``, all in US cents.

    Raises:
        ValueError: ``provider`` is not configured, or a token count is negative.
        TypeError: A token count is not an int (a bool is refused too).
        ConfigError: ``TEAAGENT_PRICES_FILE`` is set and its file cannot be read or is malformed.
    """
    _require_count("prompt_tokens", prompt_tokens)
    _require_count("max_output_tokens", max_output_tokens)
    price = price_for(provider, model)
    # tokens x dollars-per-1000 x 100 cents-per-dollar; multiplying before dividing keeps round figures exact.
    input_cents = prompt_tokens * price.input_per_1k * _CENTS_PER_DOLLAR / _TOKENS_PER_PRICE_UNIT
    output_cents = max_output_tokens * price.output_per_1k * _CENTS_PER_DOLLAR / _TOKENS_PER_PRICE_UNIT
    return {
        "input_cost_cents": input_cents,
        "max_output_cost_cents": output_cents,
        "total_max_cents": input_cents + output_cents,
    }
