"""SIP over TLS (``sip_tls_port`` with the operator's certificate): a call placed over a TLS
connection is answered (200 OK naming a TLS Contact, the SDP answer, RTP flowing to the
caller), and the caller's BYE on the same connection ends its session. Debian's sipp is
built without TLS, so the caller here is a small Python one over ``ssl``; the certificate
is a self-signed one for 127.0.0.1, written at test time."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import re
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.gateway import free_port, run_gateway
from support.sip_peer import OFFER, RtpPeer

from gateway.settings import Settings
from gateway.transport.sip.message import StreamFramer

pytestmark = pytest.mark.timeout(120)


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = tmp / "sip.crt", tmp / "sip.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return cert_path, key_path


async def test_a_call_over_tls_is_answered_and_the_callers_bye_ends_it(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    settings = Settings(video_engine="none", webrtc=False, engine="passthrough", sip_port=free_port(),
                        sip_tls_port=free_port(), sip_tls_cert=str(cert), sip_tls_key=str(key))  # fmt: skip
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        client = ssl.create_default_context(cafile=str(cert))  # the caller checks the gateway's certificate
        reader, writer = await asyncio.open_connection("127.0.0.1", settings.sip_tls_port, ssl=client)
        framer = StreamFramer()
        pending: list[bytes] = []

        async def next_message() -> str:
            while not pending:
                data = await asyncio.wait_for(reader.read(65536), 30)
                assert data, "the gateway closed the TLS connection"
                pending.extend(framer.feed(data))
            return pending.pop(0).decode()

        def send(method: str, cseq: int, body: str = "", to_tag: str | None = None) -> None:
            to = "<sip:agent@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
            writer.write((
                f"{method} sips:agent@127.0.0.1:{settings.sip_tls_port} SIP/2.0\r\n"
                f"Via: SIP/2.0/TLS 127.0.0.1:5061;branch=z9hG4bKtls{cseq}\r\nFrom: <sip:caller@127.0.0.1>;tag=c\r\n"
                f"To: {to}\r\nCall-ID: tls-call@127.0.0.1\r\nCSeq: {cseq} {method}\r\n"
                f"Contact: <sip:caller@127.0.0.1:5061;transport=tls>\r\nMax-Forwards: 70\r\n"
                + ("Content-Type: application/sdp\r\n" if body else "")
                + f"Content-Length: {len(body)}\r\n\r\n{body}"
            ).encode())  # fmt: skip

        try:
            send("INVITE", 1, OFFER.format(port=peer.port, profile="RTP/AVP"))
            while not (message := await next_message()).startswith("SIP/2.0 200"):
                assert re.match(r"SIP/2\.0 1\d\d ", message), message
            assert ";transport=tls>" in message and "m=audio " in message
            tag = re.search(r"^To: .*;tag=(\w+)", message, re.M).group(1)  # type: ignore[union-attr]
            send("ACK", 1, to_tag=tag)
            await peer.wait_remote()  # the call's RTP reaches the caller
            assert gw.runtime.session_count() == 1
            send("BYE", 2, to_tag=tag)
            assert (await next_message()).startswith("SIP/2.0 200 OK")
            for _ in range(200):
                if gw.runtime.session_count() == 0:
                    break
                await asyncio.sleep(0.05)
            assert gw.runtime.session_count() == 0
        finally:
            writer.close()
            peer.close()
