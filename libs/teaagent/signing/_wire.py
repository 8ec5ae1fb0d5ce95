"""The SSH wire encoding (RFC 4251 section 5): ``uint32``, ``string`` and ``mpint``, strictly.

Every reader error is a :class:`~teaagent.errors.SignatureError` whose sentence names the field being
read, so a malformed key or signature never escapes as ``IndexError`` or ``struct.error``.
"""

from __future__ import annotations

import struct

from teaagent.errors import SignatureError

_U32 = struct.Struct(">I")
unpack_u32 = _U32.unpack_from
pack_u32 = _U32.pack


class WireReader:
    """Reads SSH wire fields from one buffer, refusing truncation and (with :meth:`finish`) leftovers."""

    __slots__ = ("_buf", "_off", "what")

    def __init__(self, buf: bytes, what: str) -> None:
        self._buf = buf
        self._off = 0
        self.what = what  # "signature", "public key", ... used in the sentences below

    @property
    def remaining(self) -> int:
        return len(self._buf) - self._off

    def u8(self, field: str) -> int:
        if self._off + 1 > len(self._buf):
            raise SignatureError(f"the {self.what} is truncated: it ends before the {field}.")
        value = self._buf[self._off]
        self._off += 1
        return value

    def u32(self, field: str) -> int:
        if self._off + 4 > len(self._buf):
            raise SignatureError(f"the {self.what} is truncated: it ends before the {field}.")
        (value,) = unpack_u32(self._buf, self._off)
        self._off += 4
        return int(value)

    def string(self, field: str) -> bytes:
        length = self.u32(field)
        end = self._off + length
        if end > len(self._buf):
            raise SignatureError(
                f"the {self.what} is truncated: its {field} claims {length} bytes "
                f"but only {len(self._buf) - self._off} remain."
            )
        value = self._buf[self._off : end]
        self._off = end
        return value

    def text(self, field: str) -> str:
        raw = self.string(field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SignatureError(f"the {self.what}'s {field} is not valid UTF-8 text.") from None

    def mpint(self, field: str) -> int:
        raw = self.string(field)
        if not raw:
            return 0
        if raw[0] & 0x80:
            raise SignatureError(f"the {self.what}'s {field} is a negative number.")
        if raw[0] == 0 and (len(raw) == 1 or raw[1] < 0x80):
            # Only one encoding of each number is accepted, so a signature cannot be re-encoded.
            raise SignatureError(f"the {self.what}'s {field} is not minimally encoded.")
        return int.from_bytes(raw, "big")

    def finish(self) -> None:
        if self._off != len(self._buf):
            extra = len(self._buf) - self._off
            plural = "s" if extra != 1 else ""
            raise SignatureError(f"the {self.what} has {extra} unexpected trailing byte{plural}.")


def put_string(value: bytes) -> bytes:
    """Encode ``value`` as an SSH ``string`` (uint32 length, then the bytes)."""
    return pack_u32(len(value)) + value


def put_mpint(value: int) -> bytes:
    """Encode a non-negative integer as an SSH ``mpint`` (two's complement, minimal, big-endian)."""
    if value < 0:
        raise ValueError("mpint values here are never negative")
    if value == 0:
        return pack_u32(0)
    return put_string(value.to_bytes((value.bit_length() + 8) // 8, "big"))
