"""Authenticated gRPC plumbing: per-caller keys checked before a request is read, TLS, channels,
unary calls with deadlines, and a server of raw-bytes services.

The services use gRPC's generic handlers with raw-bytes methods, so no ``.proto`` file or
generated code is needed. Every call carries a key in its gRPC metadata (:data:`KEY_HEADER`),
compared with :func:`hmac.compare_digest` against the service's key table before the request is
read (:class:`_KeyCheck`, a server interceptor); a call without a valid key gets
``UNAUTHENTICATED`` (:class:`AuthenticationError` on the client). Every call has a deadline
(:func:`call_unary`); one that misses it raises ``TimeoutError`` naming the service, the method
and the address. **TLS** (:class:`TLSFiles`): a :class:`ServiceServer` with a certificate and
key may bind any interface; without TLS it listens on loopback only (:data:`LOOPBACK`).
"""

from __future__ import annotations

import dataclasses
import hmac
import secrets
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

from fedrec.federation.messages import InvalidMessage
from fedrec.federation.wire import WireError

try:
    import grpc
except ImportError:  # pragma: no cover - grpcio comes with the flower extra
    grpc = None

#: Largest gRPC message (both ways) by default: above the channel's 64 MiB message limit, and
#: enough for a party's state_dict (replay included) at the built-in settings.
DEFAULT_MAX_GRPC_BYTES = 1 << 30
#: Default deadline of one remote call, in seconds.
DEFAULT_TIMEOUT_S = 60.0
#: The only interfaces a server without TLS listens on.
LOOPBACK = ("127.0.0.1", "::1", "localhost")
#: The gRPC metadata entry that carries a caller's key.
KEY_HEADER = "x-fedrec-key"


class AuthenticationError(PermissionError):
    """A call without a valid key, or outside what its key allows."""


@dataclasses.dataclass(frozen=True)
class TLSFiles:
    """TLS for the gRPC services (parties on different hosts).

    :param cert_file: PEM certificate the servers present (its subject alternative names must
        name the host the clients dial, or set ``server_name``).
    :param key_file: PEM private key of ``cert_file`` (servers only).
    :param ca_file: PEM root certificate(s) the clients trust (default ``cert_file``: a
        self-signed certificate trusts itself).
    :param server_name: the name the clients check the certificate against, when it is not the
        dialled host (e.g. ``"localhost"`` for a certificate made for it).
    """

    cert_file: str
    key_file: str = ""
    ca_file: str = ""
    server_name: str = ""

    def server_credentials(self) -> Any:
        """``grpc.ssl_server_credentials`` of the certificate and key."""
        if not self.key_file:
            raise ValueError("TLS for a server needs key_file (the certificate's private key)")
        pair = (_read(self.key_file, "TLS key"), _read(self.cert_file, "TLS certificate"))
        return require_grpc().ssl_server_credentials([pair])

    def channel_credentials(self) -> Any:
        """``grpc.ssl_channel_credentials`` trusting ``ca_file`` (or the certificate)."""
        root = _read(self.ca_file or self.cert_file, "TLS root certificate")
        return require_grpc().ssl_channel_credentials(root_certificates=root)

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read the {what} {path!r}: {error.strerror}") from None


def new_key() -> str:
    """A fresh random key (256 bits, hex) for one caller of one run."""
    return secrets.token_hex(32)


def identify(context: Any, keys: Mapping[str, str]) -> str | None:
    """Whose key the call carries (``keys`` maps key -> identity), or None. Each key is compared
    in constant time (:func:`hmac.compare_digest`)."""
    given = next((v for k, v in context.invocation_metadata() if k == KEY_HEADER), None)
    if not isinstance(given, str):
        return None
    found = None
    for key, who in list(keys.items()):
        if hmac.compare_digest(key.encode(), given.encode()):
            found = who
    return found


def require_grpc() -> Any:
    """The ``grpc`` module, or an ``ImportError`` saying how to install it."""
    if grpc is None:
        raise ImportError("parties in separate processes need grpcio: pip install 'fedrec[flower]'")
    return grpc


def _grpc_options(max_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_bytes),
        ("grpc.max_receive_message_length", max_bytes),
    ]


#: ``(request bytes, caller identity) -> reply bytes``: a method of a service here.
Handler = Callable[[bytes, str], bytes]


class ServiceServer:
    """A gRPC server of raw-bytes services, every call authenticated.

    :param host: the interface to bind; without ``tls`` loopback only. A ``port`` of 0 lets the
        OS pick a free one.
    :param services: ``{service name: {method: handler(request, identity) -> bytes}}``.
    :param keys: ``{service name: {key: identity}}``: who may call each service (a service
        without a table refuses every call). The tables are kept, not copied: a key added to one
        later is accepted.
    :param tls: serve TLS with this certificate and key (:class:`TLSFiles`).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        services: Mapping[str, Mapping[str, Handler]] | None = None,
        keys: Mapping[str, Mapping[str, str]] | None = None,
        tls: TLSFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_GRPC_BYTES,
        max_workers: int = 8,
    ) -> None:
        if host not in LOOPBACK and tls is None:
            raise ValueError(
                f"host {host!r}: without TLS the services listen on loopback only "
                f"({', '.join(LOOPBACK)}); give tls=TLSFiles(cert_file, key_file)"
            )
        grpc_ = require_grpc()
        handlers = {name: dict(methods) for name, methods in (services or {}).items()}
        tables: dict[str, Mapping[str, str]] = dict(keys or {})
        self.server = grpc_.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            options=_grpc_options(max_message_bytes),
            interceptors=[_KeyCheck(tables)],
        )
        for name, methods in handlers.items():
            table = tables.get(name, {})
            generic = grpc_.method_handlers_generic_handler(
                name, {method: _unary(fn, table) for method, fn in methods.items()}
            )
            self.server.add_generic_rpc_handlers((generic,))
        address = f"{host}:{port}"
        if tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, tls.server_credentials())
        if not self.port:
            raise OSError(f"could not bind a gRPC server to {address}")
        self.address = f"{host}:{self.port}"
        self.server.start()

    def stop(self, grace: float | None = 0.5) -> None:
        self.server.stop(grace).wait(5.0)


class _KeyCheck:
    """A server interceptor that refuses a call without a valid key before any handler runs
    (its request is discarded undecoded)."""

    def __init__(self, tables: Mapping[str, Mapping[str, str]]) -> None:
        self.tables = tables

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        service = details.method.strip("/").split("/")[0]
        table = self.tables.get(service, {})
        given = next((v for k, v in details.invocation_metadata if k == KEY_HEADER), None)
        ok = isinstance(given, str) and any(
            hmac.compare_digest(key.encode(), given.encode()) for key in list(table)
        )
        return continuation(details) if ok else _REFUSE


def _refuse(request: bytes, context: Any) -> bytes:
    del request
    context.abort(require_grpc().StatusCode.UNAUTHENTICATED, "no valid fedrec key for this call")
    raise AssertionError("unreachable")  # abort raises


_REFUSE = (
    None
    if grpc is None
    else grpc.unary_unary_rpc_method_handler(
        _refuse, request_deserializer=lambda b: b"", response_serializer=None
    )
)


def _unary(handler: Handler, keys: Mapping[str, str]) -> Any:
    """A raw-bytes unary method that finds its caller's identity and maps errors to statuses."""
    grpc_ = require_grpc()
    codes = grpc_.StatusCode

    def method(request: bytes, context: Any) -> bytes:
        who = identify(context, keys)
        if who is None:
            context.abort(codes.UNAUTHENTICATED, "no valid fedrec key for this call")
        try:
            return handler(request, who)
        except AuthenticationError as error:
            context.abort(codes.PERMISSION_DENIED, str(error))
        except LookupError as error:
            context.abort(codes.NOT_FOUND, str(error))
        except (WireError, InvalidMessage, KeyError, TypeError) as error:
            context.abort(codes.INVALID_ARGUMENT, f"undeliverable or malformed request: {error}")
        raise AssertionError("unreachable")  # abort raises

    return grpc_.unary_unary_rpc_method_handler(method)


def open_channel(
    address: str, *, tls: TLSFiles | None = None, max_message_bytes: int = DEFAULT_MAX_GRPC_BYTES
) -> Any:
    """A gRPC channel to ``address`` (TLS when ``tls`` is given)."""
    grpc_ = require_grpc()
    options: list[tuple[str, Any]] = list(_grpc_options(max_message_bytes))
    if tls is None:
        return grpc_.insecure_channel(address, options=options)
    options += tls.channel_options()
    return grpc_.secure_channel(address, tls.channel_credentials(), options=options)


def call_unary(
    method: Any,
    request: bytes,
    *,
    timeout_s: float,
    what: str,
    metadata: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """One unary call with a deadline; gRPC errors become ``TimeoutError`` (deadline),
    ``LookupError`` (not found), ``ConnectionError`` (unreachable), :class:`AuthenticationError`
    (no valid key, or a call outside it), ``InvalidMessage`` (refused) or ``RuntimeError``."""
    grpc_ = require_grpc()
    try:
        return method(request, timeout=timeout_s, metadata=metadata)
    except grpc_.RpcError as error:
        code, detail = error.code(), error.details()
        if code == grpc_.StatusCode.DEADLINE_EXCEEDED:
            raise TimeoutError(f"{what}: no answer within {timeout_s:.0f} s") from None
        if code == grpc_.StatusCode.NOT_FOUND:
            raise LookupError(detail) from None
        if code == grpc_.StatusCode.UNAVAILABLE:
            raise ConnectionError(f"{what}: unreachable ({detail})") from None
        if code in (grpc_.StatusCode.UNAUTHENTICATED, grpc_.StatusCode.PERMISSION_DENIED):
            raise AuthenticationError(f"{what}: {detail}") from None
        if code == grpc_.StatusCode.INVALID_ARGUMENT:
            raise InvalidMessage(f"{what}: {detail}") from None
        raise RuntimeError(f"{what}: {code.name}: {detail}") from None
