"""Optional encryption of every payload Temporal stores: personal data (the
email address, the task, the drafted reply) never reaches the server in clear.

A payload codec runs in the client process (worker, starter, demo, tests) on
the way to and from the server, after the data converter has turned values into
payloads. This one seals each payload with AES-256-GCM:

- the whole serialised ``Payload`` (its metadata too, so even the original
  encoding is hidden) is encrypted with a fresh 96-bit random nonce;
- the new payload's metadata says ``encoding: binary/encrypted`` and names the
  key in ``encryption-key-id``; the key id is also the GCM associated data, so
  a payload cannot be passed off as sealed under another key;
- ``data`` is ``nonce || ciphertext || tag``.

Configuration (environment only; nothing is on unless ``LAB_CODEC_KEY`` is set):

``LAB_CODEC_KEY``
    The current key: 32 random bytes, base64 (``python -m flowclient.codec
    new-key`` prints one). Encrypts everything new and decrypts its own payloads.
``LAB_CODEC_KEY_ID``
    Its name, stored in each payload (default ``key-1``): 1-64 of
    ``[A-Za-z0-9._-]``. It is not secret.
``LAB_CODEC_OLD_KEYS``
    Retired keys that may still be needed to read older histories, as
    ``id:base64,id:base64``. Decrypt only.

Rotation: give the new key a new id, move the old one to ``LAB_CODEC_OLD_KEYS``
on every process (workers first, since they must read running histories),
then switch ``LAB_CODEC_KEY``. A payload under a key id nobody holds fails
with :class:`UnknownKeyError`, which names the id.

Payloads without the ``binary/encrypted`` encoding are passed through on
decode, so a process with the codec on still reads runs started before it was
turned on. The key itself never goes into a payload, a log line or an error
message. Sizes: each payload grows by 28 bytes plus the metadata.

Failure messages and stack traces are encrypted too: with the codec on, the
converter uses the SDK's failure converter with encoded attributes, which
moves them into an encoded payload (some errors quote a value, e.g. a refused
email address). Readers decode them (``flowclient.status``).

What it does not hide: workflow and activity type names, the workflow id (the
run id), task queue names, timestamps and the failures' error types.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import re
import sys
from typing import Iterable, Mapping, Sequence

import temporalio.converter
from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter, PayloadCodec

ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
DEFAULT_KEY_ID = "key-1"
KEY_BYTES = 32
NONCE_BYTES = 12

_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class CodecConfigError(ValueError):
    """The codec's environment is wrong; the message says which variable and how to fix it."""


class UnknownKeyError(ValueError):
    """A payload was sealed under a key id this process does not hold."""


class DecryptionError(ValueError):
    """A payload names a known key but does not open with it: wrong key material, or tampering."""


def _aesgcm():
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as err:  # the optional extra is missing
        raise CodecConfigError(
            "LAB_CODEC_KEY is set but the 'cryptography' package is not installed: "
            "pip install 'durable-agent-lab[crypto]'"
        ) from err
    return AESGCM


def parse_key(value: str, variable: str = "LAB_CODEC_KEY") -> bytes:
    """Base64 text to a 32-byte key, or CodecConfigError that never echoes the value."""
    text = value.strip()
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise CodecConfigError(
            f"{variable} is not valid base64. Give 32 random bytes in base64, e.g. the output of "
            "`python -m flowclient.codec new-key`"
        ) from None
    if len(key) != KEY_BYTES:
        raise CodecConfigError(
            f"{variable} decodes to {len(key)} bytes; AES-256-GCM needs exactly {KEY_BYTES}. "
            "Generate one with `python -m flowclient.codec new-key`"
        )
    return key


def check_key_id(key_id: str, variable: str = "LAB_CODEC_KEY_ID") -> str:
    if not _KEY_ID.fullmatch(key_id):
        raise CodecConfigError(f"{variable}={key_id!r} must be 1-64 of letters, digits, '.', '_' and '-'")
    return key_id


def parse_old_keys(value: str) -> dict[str, bytes]:
    """``id:base64,id:base64`` to {id: key}."""
    keys: dict[str, bytes] = {}
    for n, item in enumerate(filter(None, (part.strip() for part in value.split(","))), 1):
        key_id, sep, material = item.partition(":")
        if not sep:
            raise CodecConfigError(
                f"LAB_CODEC_OLD_KEYS entry {n} has no ':'; the format is id:base64,id:base64"
            )
        key_id = check_key_id(key_id.strip(), f"LAB_CODEC_OLD_KEYS entry {n}'s id")
        if key_id in keys:
            raise CodecConfigError(f"LAB_CODEC_OLD_KEYS names key id {key_id!r} twice")
        keys[key_id] = parse_key(material, f"LAB_CODEC_OLD_KEYS entry {n} ({key_id})")
    return keys


class AesGcmCodec(PayloadCodec):
    """Encrypts with the current key; decrypts with the current key or any old one."""

    def __init__(self, key_id: str, key: bytes, old_keys: Mapping[str, bytes] | None = None) -> None:
        AESGCM = _aesgcm()
        self.key_id = check_key_id(key_id)
        if len(key) != KEY_BYTES:
            raise CodecConfigError(f"the key is {len(key)} bytes; AES-256-GCM needs {KEY_BYTES}")
        old = dict(old_keys or {})
        if key_id in old and old[key_id] != key:
            raise CodecConfigError(
                f"key id {key_id!r} is both the current key and an old key, with different material: "
                "give every key its own id"
            )
        old[key_id] = key
        self._ciphers = {kid: AESGCM(material) for kid, material in old.items()}
        self._current = self._ciphers[key_id]

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._ciphers)

    def __repr__(self) -> str:  # never the key material
        return f"AesGcmCodec(key_id={self.key_id!r}, decrypts={self.key_ids})"

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._current.encrypt(nonce, payload.SerializeToString(), self.key_id.encode())
        return Payload(
            metadata={"encoding": ENCODING, KEY_ID_METADATA: self.key_id.encode()},
            data=nonce + sealed,
        )

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # written before the codec was on: readable as it is
        raw_id = payload.metadata.get(KEY_ID_METADATA, b"")
        key_id = raw_id.decode("utf-8", "replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnknownKeyError(
                f"payload is encrypted with key id {key_id!r}, which this process does not hold "
                f"(it holds {', '.join(self.key_ids)}). Add that key to LAB_CODEC_OLD_KEYS as "
                f"{key_id}:<base64 key>"
            )
        data = payload.data
        try:
            from cryptography.exceptions import InvalidTag

            plain = cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], raw_id)
        except InvalidTag:
            raise DecryptionError(
                f"payload under key id {key_id!r} does not decrypt: the key given for that id is not "
                "the one it was encrypted with, or the payload was altered"
            ) from None
        return Payload.FromString(plain)


def codec_from_env(env: Mapping[str, str] | None = None) -> AesGcmCodec | None:
    """The codec the environment asks for, or None when ``LAB_CODEC_KEY`` is unset or empty."""
    env = os.environ if env is None else env
    raw = (env.get("LAB_CODEC_KEY") or "").strip()
    if not raw:
        if (env.get("LAB_CODEC_OLD_KEYS") or "").strip():
            raise CodecConfigError(
                "LAB_CODEC_OLD_KEYS is set but LAB_CODEC_KEY is not: set the current key too"
            )
        return None
    key_id = check_key_id((env.get("LAB_CODEC_KEY_ID") or DEFAULT_KEY_ID).strip())
    return AesGcmCodec(key_id, parse_key(raw), parse_old_keys(env.get("LAB_CODEC_OLD_KEYS") or ""))


def data_converter_from_env(env: Mapping[str, str] | None = None) -> DataConverter:
    """The SDK's default converter, with the codec when the environment enables it."""
    codec = codec_from_env(env)
    default = temporalio.converter.default()
    if codec is None:
        return default
    return dataclasses.replace(
        default,
        payload_codec=codec,
        failure_converter_class=temporalio.converter.DefaultFailureConverterWithEncodedAttributes,
    )


def new_key() -> str:
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def main(argv: Iterable[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["new-key"]:
        print(new_key())
        return 0
    if args == ["check"]:
        try:
            codec = codec_from_env()
        except CodecConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print("payload encryption off (LAB_CODEC_KEY unset)" if codec is None else
              f"payload encryption on: encrypts with {codec.key_id!r}, decrypts {', '.join(codec.key_ids)}")
        return 0
    print("usage: python -m flowclient.codec new-key | check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
