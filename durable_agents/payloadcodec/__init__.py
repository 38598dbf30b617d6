"""Optional encryption of every payload Temporal stores: personal data (the
email address, the task, the drafted reply) never reaches the server in clear.

A payload codec runs in the client process (worker, starter, demo, tests, the
codec server) on the way to and from the server, after the data converter has
turned values into payloads. This one seals each payload with AES-256-GCM:

- the whole serialised ``Payload`` (its metadata too, so even the original
  encoding is hidden) is encrypted with a fresh 96-bit random nonce;
- the new payload's metadata says ``encoding: binary/encrypted`` and names the
  key in ``encryption-key-id``; ``data`` is ``nonce || ciphertext || tag``;
- the GCM associated data binds the payload to its run: a payload encoded for
  a workflow (the SDK's serialization context names it: workflow input and
  result, activity input and result, failures, queries, memo) carries that
  workflow id in ``encryption-workflow-id``, and the associated data is the
  key id *and* the workflow id. A reader that knows which workflow it is
  reading (workers, replay, ``durable_agents.flowclient.status``) refuses a payload bound to
  another one with :class:`PayloadBindingError`; changing the stored id makes
  the payload fail to decrypt. A payload without ``encryption-workflow-id``
  has the key id alone as associated data: the format written before payloads
  were bound (still read, so histories recorded earlier replay), and the one
  written when there is no workflow to bind to (the codec server's /encode).

Configuration (environment only; nothing is on unless ``LAB_CODEC_KEY`` is set):

``LAB_CODEC_KEY``
    The current key: 32 random bytes, base64 (``python -m durable_agents.payloadcodec
    new-key`` prints one). Encrypts everything new and decrypts its own payloads.
``LAB_CODEC_KEY_ID``
    Its name, stored in each payload (default ``key-1``): 1-64 of
    ``[A-Za-z0-9._-]``. It is not secret.
``LAB_CODEC_DECRYPT_ONLY_KEYS``
    Keys this process decrypts with but never encrypts with, as
    ``id:base64,id:base64``: the next key while it is being rolled out, and
    retired keys that older histories still need. ``LAB_CODEC_OLD_KEYS`` (the
    earlier name) is read too; a key id may appear in both only with the same
    material, and may name the current key (same material) so that switching
    ``LAB_CODEC_KEY`` is the only change a switch needs.
``LAB_CODEC_ALLOW_PLAINTEXT``
    ``1`` to accept payloads that are not encrypted (runs recorded before
    encryption was turned on). Default: refused with
    :class:`PlaintextPayloadError`, since a plaintext payload in history did
    not come from a process holding the key.
``LAB_CODEC_BIND_PAYLOADS``
    ``0`` to write the unbound format while processes running code from
    before binding (which read only that format) are still being replaced;
    bound payloads are still read and checked. Default ``1``.

Rotation that survives a rolling restart (docs/deploy.md): (1) add the new key
to ``LAB_CODEC_DECRYPT_ONLY_KEYS`` on every process and finish that roll;
(2) make it ``LAB_CODEC_KEY`` (the old key moves to the decrypt-only list)
process by process: every process can now read what either key wrote; (3)
drop the old key once no run that used it is within the namespace's
retention. Switching ``LAB_CODEC_KEY`` before step (1) has finished makes
processes still on the old key fail with :class:`UnknownKeyError` (which
names the id) on whatever the switched ones wrote.

Upgrading processes that run the code from before binding is the same kind
of roll: that code reads only the unbound format, so run the new code with
``LAB_CODEC_BIND_PAYLOADS=0`` until no old process is left, then drop it.

The key itself never goes into a payload, a log line or an error message.
Sizes: each payload grows by 28 bytes plus the metadata (and the workflow id).

Failure messages and stack traces are encrypted too: with the codec on, the
converter uses the SDK's failure converter with encoded attributes, which
moves them into an encoded payload (some errors quote a value, e.g. a refused
email address). Readers decode them (``durable_agents.flowclient.status``).

What it does not hide: workflow and activity type names, the workflow id (the
run id), task queue names, timestamps and the failures' error types.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence

import temporalio.converter
from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter, PayloadCodec, SerializationContext, WithSerializationContext

ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
WORKFLOW_ID_METADATA = "encryption-workflow-id"
DEFAULT_KEY_ID = "key-1"
KEY_BYTES = 32
NONCE_BYTES = 12
# Associated data of a bound payload: this prefix, the key id, a newline, the
# workflow id. Key ids cannot hold a newline, so the split is unambiguous; the
# prefix keeps it distinct from the unbound format (the bare key id).
_BOUND_AD_PREFIX = b"durable-agent-lab/codec/v2\n"

DECRYPT_ONLY_VARIABLES = ("LAB_CODEC_DECRYPT_ONLY_KEYS", "LAB_CODEC_OLD_KEYS")
ALLOW_PLAINTEXT_VARIABLE = "LAB_CODEC_ALLOW_PLAINTEXT"
BIND_VARIABLE = "LAB_CODEC_BIND_PAYLOADS"

_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


class CodecConfigError(ValueError):
    """The codec's environment is wrong; the message says which variable and how to fix it."""


class UnknownKeyError(ValueError):
    """A payload was sealed under a key id this process does not hold."""


class DecryptionError(ValueError):
    """A payload names a known key but does not open with it: wrong key material, or tampering."""


class PayloadBindingError(DecryptionError):
    """A payload bound to one workflow was read in another's: copied from another run."""


class PlaintextPayloadError(ValueError):
    """An unencrypted payload reached a process with encryption on, which refuses them by default."""


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
            "`python -m durable_agents.payloadcodec new-key`"
        ) from None
    if len(key) != KEY_BYTES:
        raise CodecConfigError(
            f"{variable} decodes to {len(key)} bytes; AES-256-GCM needs exactly {KEY_BYTES}. "
            "Generate one with `python -m durable_agents.payloadcodec new-key`"
        )
    return key


def check_key_id(key_id: str, variable: str = "LAB_CODEC_KEY_ID") -> str:
    if not _KEY_ID.fullmatch(key_id):
        raise CodecConfigError(f"{variable}={key_id!r} must be 1-64 of letters, digits, '.', '_' and '-'")
    return key_id


def parse_old_keys(value: str, variable: str = "LAB_CODEC_OLD_KEYS") -> dict[str, bytes]:
    """``id:base64,id:base64`` to {id: key}."""
    keys: dict[str, bytes] = {}
    for n, item in enumerate(filter(None, (part.strip() for part in value.split(","))), 1):
        key_id, sep, material = item.partition(":")
        if not sep:
            raise CodecConfigError(
                f"{variable} entry {n} has no ':'; the format is id:base64,id:base64"
            )
        key_id = check_key_id(key_id.strip(), f"{variable} entry {n}'s id")
        if key_id in keys:
            raise CodecConfigError(f"{variable} names key id {key_id!r} twice")
        keys[key_id] = parse_key(material, f"{variable} entry {n} ({key_id})")
    return keys


def decrypt_only_keys(env: Mapping[str, str]) -> dict[str, bytes]:
    """The union of ``LAB_CODEC_DECRYPT_ONLY_KEYS`` and ``LAB_CODEC_OLD_KEYS``."""
    keys: dict[str, bytes] = {}
    for variable in DECRYPT_ONLY_VARIABLES:
        for key_id, material in parse_old_keys(env.get(variable) or "", variable).items():
            if key_id in keys and keys[key_id] != material:
                raise CodecConfigError(
                    f"key id {key_id!r} is in both {' and '.join(DECRYPT_ONLY_VARIABLES)} with different "
                    "material: give every key its own id"
                )
            keys[key_id] = material
    return keys


def _flag(env: Mapping[str, str], variable: str, default: bool = False) -> bool:
    raw = (env.get(variable) or "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise CodecConfigError(f"{variable}={raw!r}: give 1 (or true) to turn it on, 0 (or false) to turn it off")


def _bound_ad(key_id: str, workflow_id: str) -> bytes:
    return _BOUND_AD_PREFIX + key_id.encode() + b"\n" + workflow_id.encode("utf-8")


class AesGcmCodec(PayloadCodec, WithSerializationContext):
    """Encrypts with the current key; decrypts with the current key or any decrypt-only one.

    The SDK calls :meth:`with_context` before encoding or decoding a
    workflow's payloads; the copy it returns binds new payloads to that
    workflow id and checks the binding of the payloads it decodes. Without a
    context (the codec server, code that calls the converter directly) bound
    payloads still decrypt, against the id they carry, and new ones are unbound.
    """

    def __init__(self, key_id: str, key: bytes, old_keys: Mapping[str, bytes] | None = None,
                 *, allow_plaintext: bool = False, bind: bool = True) -> None:
        AESGCM = _aesgcm()
        self.key_id = check_key_id(key_id)
        if len(key) != KEY_BYTES:
            raise CodecConfigError(f"the key is {len(key)} bytes; AES-256-GCM needs {KEY_BYTES}")
        old = dict(old_keys or {})
        if key_id in old and old[key_id] != key:
            raise CodecConfigError(
                f"key id {key_id!r} is both the current key and a decrypt-only key, with different "
                "material: give every key its own id"
            )
        old.pop(key_id, None)
        self.decrypt_only_ids = sorted(old)
        old[key_id] = key
        self._ciphers = {kid: AESGCM(material) for kid, material in old.items()}
        self._current = self._ciphers[key_id]
        self.allow_plaintext = allow_plaintext
        self.bind = bind  # False: encrypt in the unbound format (decode still checks bound payloads)
        self.workflow_id: str | None = None  # set on the copies with_context makes

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._ciphers)

    def __repr__(self) -> str:  # never the key material
        bound = f", workflow_id={self.workflow_id!r}" if self.workflow_id is not None else ""
        return f"AesGcmCodec(key_id={self.key_id!r}, decrypts={self.key_ids}{bound})"

    def with_context(self, context: SerializationContext) -> AesGcmCodec:
        # Workflow and activity contexts name the workflow; others (Nexus) do not.
        workflow_id = getattr(context, "workflow_id", None)
        if workflow_id == self.workflow_id:
            return self
        bound = copy.copy(self)  # shares the ciphers: nothing is re-keyed
        bound.workflow_id = workflow_id
        return bound

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        nonce = os.urandom(NONCE_BYTES)
        metadata = {"encoding": ENCODING, KEY_ID_METADATA: self.key_id.encode()}
        if self.workflow_id is not None and self.bind:
            metadata[WORKFLOW_ID_METADATA] = self.workflow_id.encode("utf-8")
            ad = _bound_ad(self.key_id, self.workflow_id)
        else:
            ad = self.key_id.encode()
        sealed = self._current.encrypt(nonce, payload.SerializeToString(), ad)
        return Payload(metadata=metadata, data=nonce + sealed)

    def decrypt(self, payload: Payload, *, allow_plaintext: bool | None = None) -> Payload:
        """The original payload. ``allow_plaintext`` overrides the configured policy
        (the codec server shows plaintext payloads as they are: it only displays)."""
        if payload.metadata.get("encoding") != ENCODING:
            if self.allow_plaintext if allow_plaintext is None else allow_plaintext:
                return payload  # written before the codec was on: readable as it is
            encoding = payload.metadata.get("encoding", b"").decode("utf-8", "replace") or "none"
            raise PlaintextPayloadError(
                f"payload is not encrypted (encoding {encoding!r}) but payload encryption is on, so it "
                "was not written by a process holding the key: refused. If runs recorded before "
                f"encryption was turned on must stay readable, set {ALLOW_PLAINTEXT_VARIABLE}=1 on "
                "this process"
            )
        raw_id = payload.metadata.get(KEY_ID_METADATA, b"")
        key_id = raw_id.decode("utf-8", "replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnknownKeyError(
                f"payload is encrypted with key id {key_id!r}, which this process does not hold "
                f"(it holds {', '.join(self.key_ids)}). Add that key to LAB_CODEC_DECRYPT_ONLY_KEYS as "
                f"{key_id}:<base64 key> (on every process: see the rotation steps in docs/deploy.md)"
            )
        raw_wid = payload.metadata.get(WORKFLOW_ID_METADATA)
        if raw_wid is None:
            ad = raw_id  # the unbound format: key id only
        else:
            bound_to = raw_wid.decode("utf-8", "replace")
            if self.workflow_id is not None and bound_to != self.workflow_id:
                raise PayloadBindingError(
                    f"payload is bound to workflow id {bound_to!r} but was read for workflow id "
                    f"{self.workflow_id!r}: it was copied from another run into this one. Refused"
                )
            ad = _bound_ad(key_id, bound_to)
        data = payload.data
        try:
            from cryptography.exceptions import InvalidTag

            plain = cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], ad)
        except InvalidTag:
            raise DecryptionError(
                f"payload under key id {key_id!r} does not decrypt: the key given for that id is not "
                "the one it was encrypted with, or the payload (or the workflow id it is bound to) "
                "was altered"
            ) from None
        return Payload.FromString(plain)


def codec_from_env(env: Mapping[str, str] | None = None) -> AesGcmCodec | None:
    """The codec the environment asks for, or None when ``LAB_CODEC_KEY`` is unset or empty."""
    env = os.environ if env is None else env
    raw = (env.get("LAB_CODEC_KEY") or "").strip()
    if not raw:
        for variable in DECRYPT_ONLY_VARIABLES:
            if (env.get(variable) or "").strip():
                raise CodecConfigError(f"{variable} is set but LAB_CODEC_KEY is not: set the current key too")
        return None
    key_id = check_key_id((env.get("LAB_CODEC_KEY_ID") or DEFAULT_KEY_ID).strip())
    return AesGcmCodec(key_id, parse_key(raw), decrypt_only_keys(env),
                       allow_plaintext=_flag(env, ALLOW_PLAINTEXT_VARIABLE),
                       bind=_flag(env, BIND_VARIABLE, default=True))


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


def describe(codec: AesGcmCodec | None) -> str:
    """One line on what this process does with payloads; names only, never key material."""
    if codec is None:
        return "payload encryption off (LAB_CODEC_KEY unset)"
    staged = f" (decrypt only: {', '.join(codec.decrypt_only_ids)})" if codec.decrypt_only_ids else ""
    plaintext = ("accepted (LAB_CODEC_ALLOW_PLAINTEXT)" if codec.allow_plaintext
                 else f"refused (set {ALLOW_PLAINTEXT_VARIABLE}=1 to read runs recorded before encryption)")
    bound = ("new payloads bound to their workflow id" if codec.bind
             else f"new payloads unbound ({BIND_VARIABLE}=0), bound ones still checked")
    return (f"payload encryption on: encrypts with {codec.key_id!r}, decrypts {', '.join(codec.key_ids)}"
            f"{staged}; {bound}; plaintext payloads {plaintext}")


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
        print(describe(codec))
        return 0
    print("usage: python -m durable_agents.payloadcodec new-key | check", file=sys.stderr)
    return 2
