"""A test token issuer: what a user's own backend does to let a browser in.

It holds an RSA (RS256) and an EC P-256 (ES256) key pair, mints tokens with
PyJWT, and serves its JWKS over real HTTP on 127.0.0.1 (``serve``), where a
test can rotate the keys, make the endpoint fail, or make it slow.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

HS_SECRET = "test-issuer-shared-secret-0123456789abcdef"  # 42 bytes: PyJWT wants >= 32 for HS256


class TestIssuer:
    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self._generation = 0
        self.rotate()
        self.fail = False  # the JWKS endpoint answers 500
        self.delay_s = 0.0  # the JWKS endpoint answers this late
        self.hits = 0

    def rotate(self) -> None:
        """New key pairs under new key ids (the old ones leave the JWKS)."""
        self._generation += 1
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.rsa_kid = f"rsa-{self._generation}"
        self.ec_kid = f"ec-{self._generation}"

    def jwks(self) -> dict[str, Any]:
        rsa_jwk = RSAAlgorithm.to_jwk(self.rsa.public_key(), as_dict=True)
        ec_jwk = ECAlgorithm.to_jwk(self.ec.public_key(), as_dict=True)
        return {
            "keys": [
                {**rsa_jwk, "kid": self.rsa_kid, "use": "sig", "alg": "RS256"},
                {**ec_jwk, "kid": self.ec_kid, "use": "sig", "alg": "ES256"},
            ]
        }

    def claims(self, sub: str, ttl_s: float, **extra: Any) -> dict[str, Any]:
        now = int(time.time())
        return {"sub": sub, "iat": now, "exp": now + int(ttl_s), **extra}

    def rs256(self, sub: str, *, ttl_s: float = 300, kid: str | None = None, **extra: Any) -> str:
        headers = {"kid": kid if kid is not None else self.rsa_kid}
        return jwt.encode(self.claims(sub, ttl_s, **extra), self.rsa, algorithm="RS256", headers=headers)

    def es256(self, sub: str, *, ttl_s: float = 300, **extra: Any) -> str:
        return jwt.encode(self.claims(sub, ttl_s, **extra), self.ec, algorithm="ES256", headers={"kid": self.ec_kid})

    def hs256(self, sub: str, *, ttl_s: float = 300, secret: str = HS_SECRET, **extra: Any) -> str:
        return jwt.encode(self.claims(sub, ttl_s, **extra), secret, algorithm="HS256")

    @contextlib.contextmanager
    def serve(self) -> Iterator[str]:
        """Serve the JWKS at ``http://127.0.0.1:<port>/jwks.json``; yields that URL."""
        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                issuer.hits += 1
                if issuer.delay_s:
                    time.sleep(issuer.delay_s)
                if issuer.fail or self.path != "/jwks.json":
                    self.send_response(500 if issuer.fail else 404)
                    self.end_headers()
                    return
                body = json.dumps(issuer.jwks()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up on a slow answer (the slow-JWKS test) is expected

        server = Server(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
        finally:
            server.shutdown()
            server.server_close()
