"""The agent service's models and settings: the configured models, the one in use, its effort and
the permission mode, the models' check (``doctor``), and one question to the model in use."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Final

import teaagent
from teaagent.config import MODEL_NAME_PATTERN, NodeConfig
from teaagent.errors import ConfigError, LLMError, MissingAPIKeyError
from teaagent.llm import LLMMessage, LLMRequest
from teaagent.policy import PermissionMode
from teaagent_agent._catalog import (
    MODES_BY_PERMISSION,
    ModelEntry,
    make_adapter,
    models_of,
    permission_of,
)
from teaagent_agent._config_file import ModelsFileError, write_model_tables
from teaagent_agent._errors import ApiError, sentence
from teaagent_agent._schemas import (
    PERMISSION_NAMES,
    DoctorOut,
    ModelCheckOut,
    ModelCreate,
    ModelOut,
    ModelsOut,
    ModelUpdate,
    SettingsOut,
    SettingsUpdate,
)
from teaagent_agent._settings import Settings
from teaagent_agent._state import PreferencesFile

__all__ = ["ServiceModels"]

DOCTOR_PROMPT: Final = "Reply with the single word: ok"


class ServiceModels:
    """The models and settings of the agent service (a part of ``AgentService``)."""

    settings: Settings
    node: NodeConfig
    preferences: PreferencesFile

    def models(self) -> list[ModelEntry]:
        overrides = self.preferences.value.compact_percent
        entries = models_of(self.node)
        return [
            entry
            if entry.name not in overrides
            else ModelEntry(**{**entry.__dict__, "compact_percent": overrides[entry.name]})
            for entry in entries
        ]

    def model(self, name: str) -> ModelEntry:
        for entry in self.models():
            if entry.name == name:
                return entry
        raise ApiError(404, "not_found", f"No model is named {name!r}; GET /models lists them.")

    def current_model(self) -> ModelEntry | None:
        entries = self.models()
        chosen = self.preferences.value.model
        for entry in entries:
            if entry.name == chosen:
                return entry
        return entries[0] if entries else None

    def model_out(self, entry: ModelEntry) -> ModelOut:
        current = self.current_model()
        return ModelOut(
            name=entry.name,
            model=entry.model,
            context_window=entry.context_window,
            multimodal=entry.multimodal,
            efforts=list(entry.efforts),
            active=current is not None and current.name == entry.name,
            compact_percent=entry.compact_percent,
        )

    def models_out(self) -> ModelsOut:
        current = self.current_model()
        return ModelsOut(
            models=[self.model_out(entry) for entry in self.models()],
            current=None if current is None else current.name,
        )

    def _write_models(self, change: Any) -> None:
        try:
            self.node = write_model_tables(self.node.path, change, label=str(self.node.path))
        except ModelsFileError as exc:
            raise ApiError(409, "invalid", sentence(str(exc))) from None
        except ConfigError as exc:
            raise ApiError(422, "invalid", sentence(f"the model was not written: {exc}")) from None
        except OSError as exc:
            raise ApiError(
                500, "internal", sentence(f"{self.node.path} cannot be written: {exc.strerror or exc}")
            ) from None

    def add_model(self, body: ModelCreate) -> ModelOut:
        name = body.display_model or body.model
        if MODEL_NAME_PATTERN.fullmatch(name) is None:
            raise ApiError(
                422,
                "invalid",
                f"{name!r} cannot name a model: give display_model, 1 to 64 letters, digits, "
                "'.', '_', ':' or '-'.",
            )

        def change(tables: dict[str, dict[str, Any]]) -> None:
            if name in tables:
                raise ModelsFileError(
                    f"a model named {name!r} is configured already; PATCH /models/{name} changes it."
                )
            tables[name] = body.entry()

        self._write_models(change)
        return self.model_out(self.model(name))

    def update_model(self, name: str, body: ModelUpdate) -> ModelOut:
        entry = self.model(name)
        if entry.builtin:
            raise ApiError(
                409,
                "invalid",
                f"The model {name!r} is node.toml's [agent] provider, not a [models] table; "
                "add a model instead.",
            )
        changes = body.changes()

        def change(tables: dict[str, dict[str, Any]]) -> None:
            if name not in tables:
                raise ModelsFileError(f"no [models] table is named {name!r} any more.")
            table = tables[name]
            for key, value in changes.items():
                flag_off = key in ("anthropic", "responses_api", "multimodal") and value is False
                if flag_off or (key == "reasoning_efforts" and not value):
                    table.pop(key, None)
                else:
                    table[key] = value

        self._write_models(change)
        return self.model_out(self.model(name))

    def remove_model(self, name: str) -> None:
        entry = self.model(name)
        if entry.builtin:
            raise ApiError(
                409,
                "invalid",
                f"The model {name!r} is node.toml's [agent] provider; it cannot be removed here.",
            )

        def change(tables: dict[str, dict[str, Any]]) -> None:
            if tables.pop(name, None) is None:
                raise ModelsFileError(f"no [models] table is named {name!r} any more.")

        self._write_models(change)
        if self.preferences.value.model == name:
            self.preferences.update(model=None, effort=None)

    def permission_mode(self) -> PermissionMode:
        chosen = self.preferences.value.permission
        if chosen in MODES_BY_PERMISSION:
            return MODES_BY_PERMISSION[chosen]
        return self.node.agent.permission_mode

    def effort(self, entry: ModelEntry) -> str:
        chosen = self.preferences.value.effort
        if chosen is not None and chosen in entry.efforts:
            return chosen
        return entry.efforts[0] if entry.efforts else "default"

    def settings_out(self) -> SettingsOut:
        entry = self.current_model()
        if entry is None:  # pragma: no cover - the [agent] provider is always a model
            raise ApiError(409, "invalid", "No model is configured; POST /models adds one.")
        return SettingsOut(
            model=self.model_out(entry),
            effort=self.effort(entry),
            efforts=list(entry.efforts),
            permission=permission_of(self.permission_mode()),  # type: ignore[arg-type]
            permissions=list(PERMISSION_NAMES),
            unsaved=self.preferences.unsaved,
        )

    def update_settings(self, body: SettingsUpdate) -> SettingsOut:
        changes: dict[str, Any] = {}
        entry = self.current_model()
        if body.model is not None:
            entry = self.model(body.model)
            changes["model"] = entry.name
            if self.preferences.value.effort not in entry.efforts:
                changes["effort"] = None
        assert entry is not None
        if body.effort is not None:
            if body.effort not in entry.efforts and not (body.effort == "default" and not entry.efforts):
                offered = ", ".join(entry.efforts) or "only default"
                raise ApiError(
                    422, "invalid", f"The model {entry.name} offers no effort {body.effort!r} ({offered})."
                )
            changes["effort"] = None if body.effort == "default" else body.effort
        if body.permission is not None:
            changes["permission"] = body.permission
        if body.compact_percent is not None:
            changes["compact_percent"] = {
                **self.preferences.value.compact_percent,
                entry.name: body.compact_percent,
            }
        if changes:
            self.preferences.update(**changes)
        return self.settings_out()

    async def doctor(self, timeout: float) -> DoctorOut:
        checks = await asyncio.gather(*(self._check(entry, timeout) for entry in self.models()))
        return DoctorOut(checks=list(checks))

    async def _check(self, entry: ModelEntry, timeout: float) -> ModelCheckOut:
        started = time.monotonic()

        def done(ok: bool, detail: str, **tokens: int) -> ModelCheckOut:
            return ModelCheckOut(
                model=entry.name,
                model_id=entry.model,
                ok=ok,
                seconds=round(time.monotonic() - started, 3),
                detail=detail,
                **tokens,
            )

        try:
            adapter = make_adapter(entry, script_path=self.settings.llm_script)
        except MissingAPIKeyError as exc:
            return done(False, str(exc))
        except (ConfigError, ValueError) as exc:
            return done(False, sentence(str(exc)))
        if entry.provider == "scripted":
            return done(True, "The offline scripted model answers without a network.")
        request = LLMRequest(messages=[LLMMessage("user", DOCTOR_PROMPT)], model=entry.model, max_tokens=16)
        try:
            response = await asyncio.wait_for(adapter.complete(request), timeout)
        except TimeoutError:
            return done(False, f"No answer within {timeout:g} seconds.")
        except Exception as exc:  # every failure of a model is its check's answer, not the service's
            return done(False, sentence(str(exc) or type(exc).__name__))
        finally:
            await _close(adapter)
        return done(
            True,
            sentence(response.content.strip()[:80] or "it answered"),
            input_tokens=response.input_tokens,
            output_tokens=response.output_tokens,
        )

    async def _ask_model(self, messages: list[LLMMessage], timeout: float | None, max_tokens: int) -> str:
        entry = self.current_model()
        if entry is None or not entry.ready():
            raise ApiError(409, "invalid", self._not_ready(entry))
        try:
            adapter = make_adapter(entry, script_path=self.settings.llm_script)
        except (ConfigError, MissingAPIKeyError, ValueError) as exc:
            raise ApiError(409, "invalid", sentence(str(exc))) from None
        request = LLMRequest(messages=messages, model=entry.model, max_tokens=max_tokens)
        try:
            response = await asyncio.wait_for(adapter.complete(request), timeout)
        except TimeoutError:
            raise ApiError(
                504, "timeout", f"The model {entry.name} did not answer within {timeout:g} seconds."
            ) from None
        except LLMError as exc:
            raise ApiError(502, "run", sentence(f"the model {entry.name} failed: {exc}")) from None
        finally:
            await _close(adapter)
        return response.content.strip()

    @staticmethod
    def _not_ready(entry: ModelEntry | None) -> str:
        if entry is None:
            return "No model is configured; POST /models adds one."
        variable = teaagent.llm.PROVIDER_CONFIGS[entry.provider].api_key_env
        return (
            f"The model {entry.name} has no API key: set {variable} or PATCH /models/{entry.name} "
            "with a token."
        )


async def _close(adapter: Any) -> None:
    """Close an adapter's HTTP client when it has one (the HTTP adapters own theirs)."""
    closer = getattr(adapter, "aclose", None)
    if callable(closer):
        with contextlib.suppress(Exception):
            await closer()
