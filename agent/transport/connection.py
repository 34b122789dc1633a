"""A TLS stream that speaks frames: the asyncio wrapper around the sans-IO codec."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

from agent.errors import CertificateDatesError, PeerRefusedError, PeerUnavailableError, RemoteProtocolError
from agent.transport.tls import date_failure, peer_name
from agent.wire import Frame, FrameDecoder, FrameType, encode_frame
from agent.wire.codec import DEFAULT_MAX_PAYLOAD

log = logging.getLogger(__name__)

READ_CHUNK = 256 * 1024
COALESCE_BYTES = 64 * 1024
"""Frames up to this size are written as one buffer: one TLS record to seal and open instead of two."""


class FrameConnection:
    """Frames over one established (TLS) stream.

    ``receive()`` returns frames in order; an end of stream without a GOODBYE frame, a reset or a
    TLS failure raises :class:`PeerUnavailableError` (a silent EOF is a failure, never a clean
    close), a frame that breaks the protocol :class:`RemoteProtocolError`.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        label: str = "",
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder(max_payload)
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.label = label or self.peer
        self.goodbye_received = False
        self.closed = False

    @property
    def peer_name(self) -> str | None:
        """Common name of the peer's fleet certificate."""
        return peer_name(self._writer.get_extra_info("ssl_object"))

    @property
    def peer_certificate(self) -> bytes | None:
        """The peer's verified certificate (DER), or None (no TLS, or no certificate)."""
        ssl_object = self._writer.get_extra_info("ssl_object")
        if ssl_object is None:
            return None
        try:
            der = ssl_object.getpeercert(binary_form=True)
        except ValueError:  # handshake not done yet
            return None
        return der or None

    async def send(self, frame: Frame) -> None:
        """Queue one frame and wait until the transport can take more."""
        if self.closed:
            raise PeerUnavailableError(f"connection to {self.label} is closed")
        try:
            buffers = encode_frame(frame)
            if len(buffers) > 1 and len(buffers[1]) <= COALESCE_BYTES:
                self._writer.write(b"".join(buffers))
            else:
                self._writer.writelines(buffers)
            await self._writer.drain()
        except (ConnectionError, ssl.SSLError, OSError) as exc:
            self.closed = True
            raise PeerUnavailableError(f"lost {self.label} while sending: {_reason(exc)}") from exc

    async def receive(self) -> Frame:
        """The next frame; a GOODBYE is returned (and marks the connection finished)."""
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                if frame.type is FrameType.GOODBYE:
                    self.goodbye_received = True
                return frame
            try:
                data = await self._reader.read(READ_CHUNK)
            except (ConnectionError, ssl.SSLError, OSError) as exc:
                self.closed = True
                raise PeerUnavailableError(f"lost {self.label}: {_reason(exc)}") from exc
            if not data:
                self.closed = True
                raise PeerUnavailableError(f"{self.label} ended the stream without a goodbye")
            self._decoder.receive_data(data)

    async def close(self, goodbye: bool = True) -> None:
        """Say goodbye (unless the peer is gone or broke the protocol) and close."""
        if self.closed and self._writer.is_closing():
            return
        if goodbye and not self.closed:
            try:
                self._writer.writelines(encode_frame(Frame(FrameType.GOODBYE)))
                async with asyncio.timeout(2.0):
                    await self._writer.drain()
            except (ConnectionError, ssl.SSLError, OSError, TimeoutError):
                pass
        self.closed = True
        self._writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError, OSError, TimeoutError):
            async with asyncio.timeout(2.0):
                await self._writer.wait_closed()

    def abort(self) -> None:
        """Drop the connection at once (after a protocol violation)."""
        self.closed = True
        transport = self._writer.transport
        transport.abort()


async def dial(
    host: str,
    port: int,
    context: ssl.SSLContext,
    *,
    timeout: float = 5.0,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    label: str = "",
) -> FrameConnection:
    """Connect with TLS and tuned socket options; errors become :class:`PeerUnavailableError`."""
    from agent.transport.sockets import tune_socket

    where = label or f"{host}:{port}"
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=context, server_hostname=host, limit=READ_CHUNK
            )
    except ssl.SSLError as exc:  # before OSError, of which it is a subclass
        dates = date_failure(exc)
        if dates is not None:
            raise CertificateDatesError(
                f"refused {where}: its certificate {dates} by this PC's clock (a clock set wrong, or a certificate "
                "to renew)"
            ) from exc
        raise PeerRefusedError(f"refused {where}: TLS handshake failed: {exc}") from exc
    except (ConnectionError, OSError, TimeoutError) as exc:
        reason = f"no answer within {timeout:.0f} s" if isinstance(exc, TimeoutError) else _reason(exc)
        raise PeerUnavailableError(f"cannot reach {where}: {reason}") from exc
    sock = writer.get_extra_info("socket")
    if sock is not None:
        tune_socket(sock)
    return FrameConnection(reader, writer, max_payload=max_payload, label=where)


async def send_quietly(connection: FrameConnection, frame: Frame) -> None:
    """Send where a dead peer is no news: its connection's reader notices and reports it (or it is being cleaned
    up elsewhere)."""
    with contextlib.suppress(PeerUnavailableError):
        await connection.send(frame)


async def expect(connection: FrameConnection, kind: FrameType, timeout: float) -> Frame:
    """The next frame, which must be of ``kind`` (used for the HELLO exchange)."""
    try:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that lands as
        # the frame arrives, and a stopping agent then waits forever for a task that never ends (the
        # middle tier's lost-stage test hung so)
        async with asyncio.timeout(timeout):
            frame = await connection.receive()
    except TimeoutError as exc:
        raise PeerUnavailableError(f"{connection.label} did not answer within {timeout:.0f} s") from exc
    if frame.type is not kind:
        raise RemoteProtocolError(f"{connection.label} sent {frame.type.name} where {kind.name} was expected")
    return frame


def _reason(exc: BaseException) -> str:
    """An exception's message, or its kind where it has none (a bare timeout or reset)."""
    return str(exc) or type(exc).__name__
