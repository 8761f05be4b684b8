"""Credentials on the actor channel (issue 14): the refusal rule, the token
interceptor on every RPC, the health service, unix socket modes, `seedq
certs`, and real learner/actor processes over TCP loopback with a token and
with mutual TLS."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time

import grpc
import pytest
import trustme

from seedq.transport import certs as certs_lib
from seedq.transport import channel
from seedq.config import AuthConfig, ServerConfig, TlsConfig, TrainConfig
from seedq.local import stop_processes
from seedq.server.service import start_server
from seedq.v1 import seed_pb2, seed_pb2_grpc

SEEDQ = [sys.executable, "-m", "seedq.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, proc=None, log=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) while waiting for {what}:\n{_text(log)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{_text(log)}")
        time.sleep(0.1)


def _text(path) -> str:
    return path.read_text() if path is not None and path.exists() else ""


def start_learner(tmp_path, name: str, *flags: str):
    """`seedq learner` on 127.0.0.1:<free port>; returns (process, address, log path, run dir)."""
    address = f"127.0.0.1:{free_port()}"
    log = tmp_path / f"{name}.log"
    run = tmp_path / name
    proc = subprocess.Popen(
        [*SEEDQ, "learner", "--address", address, "--logdir", str(run), "--log-every-seconds", "0.5",
         "--eval-episodes", "0", *flags],
        stdout=open(log, "w"), stderr=subprocess.STDOUT,
    )
    wait_for(lambda: "learner listening on" in _text(log), 120, "the learner to listen", proc, log)
    return proc, address, log, run


def start_actor(address: str, *flags: str, actor_id: str):
    return subprocess.Popen(
        [*SEEDQ, "actor", "--server", address, "--env", "CartPole-v1", "--num-envs", "32",
         "--actor-id", actor_id, *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def stop(*procs) -> None:
    stop_processes(list(procs), timeout=30)


def frames_logged(log) -> int:
    found = re.findall(r"\] ([\d,]+) fr ", _text(log))
    return int(found[-1].replace(",", "")) if found else 0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """`seedq certs` files, plus a foreign CA (trustme) whose certificates the learner must not trust."""
    out = tmp_path_factory.mktemp("pki")
    paths = certs_lib.make(str(out / "cluster"), hosts=("localhost", "127.0.0.1"))
    foreign = trustme.CA()
    client = foreign.issue_cert("actor.example")
    server = foreign.issue_cert("localhost", "127.0.0.1")
    for name, blob in {"foreign-ca.pem": foreign.cert_pem, "foreign-client.pem": client.cert_chain_pems[0],
                       "foreign-client-key.pem": client.private_key_pem,
                       "foreign-server.pem": server.cert_chain_pems[0],
                       "foreign-server-key.pem": server.private_key_pem}.items():
        blob.write_to_path(str(out / name))
        paths[name] = str(out / name)
    (out / "wrong-token").write_text("not-the-token\n")
    paths["wrong-token"] = str(out / "wrong-token")
    return paths


# --- the refusal rule ---


@pytest.mark.unit
@pytest.mark.parametrize("address, loopback", [
    ("unix:/tmp/x.sock", True), ("unix-abstract:x", False), ("127.0.0.1:50051", True), ("127.0.0.2:1", True),
    ("localhost:50051", True), ("[::1]:50051", True),
    ("0.0.0.0:50051", False), ("[::]:50051", False), ("10.0.0.5:50051", False),
    ("learner.example.com:50051", False),
])
def test_loopback_addresses(address, loopback):
    assert channel.is_loopback(address) is loopback


@pytest.mark.unit
def test_exposure_rule():
    public = "0.0.0.0:50051"
    with pytest.raises(ValueError, match="refusing to serve 0.0.0.0:50051 without client authentication"):
        channel.check_exposure(TrainConfig(), public)
    channel.check_exposure(TrainConfig(), "127.0.0.1:50051")
    channel.check_exposure(TrainConfig(insecure=True), public)
    channel.check_exposure(TrainConfig(auth=AuthConfig(token_file="t")), public)
    channel.check_exposure(TrainConfig(tls=TlsConfig(cert="c", key="k", client_ca="ca")), public)
    channel.check_exposure(TrainConfig(tls=TlsConfig(cert="c", key="k"), auth=AuthConfig(token_file="t")), public)


@pytest.mark.unit
def test_server_only_tls_is_not_client_authentication():
    """TLS without a client CA proves the learner to the actor, not the actor
    to the learner: off-host it is refused, naming both ways to authenticate."""
    with pytest.raises(ValueError) as refused:
        channel.check_exposure(TrainConfig(tls=TlsConfig(cert="c", key="k")), "0.0.0.0:50051")
    message = str(refused.value)
    assert "--tls.client-ca" in message and "--auth.token-file" in message and "\n" not in message


@pytest.mark.unit
def test_an_abstract_unix_socket_needs_credentials():
    """An abstract socket has no file mode: every local user can connect."""
    with pytest.raises(ValueError, match="without client authentication"):
        channel.check_exposure(TrainConfig(), "unix-abstract:seedq")
    channel.check_exposure(TrainConfig(), "unix:/tmp/seedq.sock")


@pytest.mark.unit
def test_a_token_in_clear_is_allowed_with_one_warning(caplog):
    caplog.set_level("WARNING", logger="seedq.server")
    channel.check_exposure(TrainConfig(auth=AuthConfig(token_file="t")), "10.0.0.5:50051")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "in clear" in warnings[0]


@pytest.mark.e2e
@pytest.mark.parametrize("tls", [False, True], ids=["no credentials", "server-only TLS"])
def test_learner_on_a_public_address_without_client_authentication_refuses_to_start(tmp_path, pki, tls):
    port = free_port()
    credentials = ["--tls.cert", pki["server.pem"], "--tls.key", pki["server-key.pem"]] if tls else []
    result = subprocess.run([*SEEDQ, "learner", "--address", f"0.0.0.0:{port}", "--logdir",
                             str(tmp_path / "run"), *credentials], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2  # a usage error: the same command fails the same way again
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"refusing to serve 0.0.0.0:{port} without client authentication" in lines[0]
    assert "--tls.client-ca" in lines[0] and "--auth.token-file" in lines[0]
    assert "--insecure" in lines[0] and "Traceback" not in result.stderr
    with socket.socket() as s:  # it never listened
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.e2e
def test_server_only_tls_with_a_token_starts(tmp_path, pki):
    port = free_port()
    log = tmp_path / "learner.log"
    proc = subprocess.Popen(
        [*SEEDQ, "learner", "--address", f"0.0.0.0:{port}", "--logdir", str(tmp_path / "run"),
         "--tls.cert", pki["server.pem"], "--tls.key", pki["server-key.pem"], "--auth.token-file", pki["token"],
         "--eval-episodes", "0"], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "learner listening on" in _text(log), 120, "the learner to listen", proc, log)
    finally:
        stop(proc)


# --- the interceptor, the health service, the unix socket: a real server in this process ---


def _call_all(target: str, metadata):
    """Status code of each Learner RPC on a fresh channel (the servicer implements none)."""

    async def main():
        codes = {}
        async with grpc.aio.insecure_channel(target) as ch:
            stub = seed_pb2_grpc.LearnerStub(ch)
            calls = {
                "Stream": lambda: stub.Stream(metadata=metadata),
                "PushUnrolls": lambda: stub.PushUnrolls(metadata=metadata),
                "PullParams": lambda: stub.PullParams(seed_pb2.ParamsRequest(), metadata=metadata),
            }
            for name, make in calls.items():
                call = make()
                try:
                    async for _ in call:
                        pass
                    codes[name] = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as e:
                    codes[name] = e.code()
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
            codes["health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return codes

    return asyncio.run(main())


@pytest.mark.e2e
def test_token_is_checked_on_every_rpc_and_health_is_exempt(tmp_path, caplog):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")

    async def serve_and_call():
        server, address, set_serving = await start_server(
            seed_pb2_grpc.LearnerServicer(), "127.0.0.1:0", auth=AuthConfig(token_file=str(token)),
        )
        await set_serving(True)
        try:
            loop = asyncio.get_running_loop()
            results = {}
            for label, metadata in {
                "none": None, "wrong": (("authorization", "Bearer nope"),),
                "right": (("authorization", "Bearer s3cret-token"),),
            }.items():
                results[label] = await loop.run_in_executor(None, _call_all, address, metadata)
            return results
        finally:
            await server.stop(None)

    with caplog.at_level("WARNING", logger="seedq.server"):
        results = asyncio.run(serve_and_call())
    unauth = grpc.StatusCode.UNAUTHENTICATED
    for label in ("none", "wrong"):
        assert {k: v for k, v in results[label].items() if k != "health"} == {
            "Stream": unauth, "PushUnrolls": unauth, "PullParams": unauth}, results[label]
        assert results[label]["health"] == "SERVING"  # probes carry no token
    # The right token passes the interceptor and reaches the (unimplemented) servicer.
    assert set(results["right"].values()) == {grpc.StatusCode.UNIMPLEMENTED, "SERVING"}
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]  # once per peer host, not per RPC
    assert "ipv4:127.0.0.1" in refusals[0].getMessage()


@pytest.mark.e2e
def test_an_unauthenticated_request_is_refused_before_it_is_received(tmp_path):
    """Size checks come after authentication: a request over the size limit
    from a peer without the token is told UNAUTHENTICATED, the learner never
    having taken in its bytes (RESOURCE_EXHAUSTED would mean it had)."""
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    oversized = seed_pb2.ParamsRequest(actor_id="x" * (70 << 20))

    async def main():
        server, address, _ = await start_server(
            seed_pb2_grpc.LearnerServicer(), "127.0.0.1:0", auth=AuthConfig(token_file=str(token)))
        try:
            async with grpc.aio.insecure_channel(address) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    async for _ in seed_pb2_grpc.LearnerStub(ch).PullParams(oversized, timeout=30):
                        pass
            return refused.value.code()
        finally:
            await server.stop(None)

    assert asyncio.run(main()) == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.e2e
def test_the_health_service_takes_small_requests_and_few_watches_without_a_token(tmp_path):
    """No token guards the health service: a request over 64 KiB is refused
    (Check and Watch alike) before it is decoded, and Watch streams beyond
    the cap are refused, while a normal check still answers."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    big = health_pb2.HealthCheckRequest(service="x" * (100 << 10))

    async def code_of(call) -> grpc.StatusCode:
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    async def check_code(stub, request) -> grpc.StatusCode:
        try:
            await stub.Check(request, timeout=30)
        except grpc.aio.AioRpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    health_port = free_port()

    async def main():
        server, address, set_serving = await start_server(
            seed_pb2_grpc.LearnerServicer(), "127.0.0.1:0", auth=AuthConfig(token_file=str(token)),
            server_config=ServerConfig(health_port=health_port))
        await set_serving(True)
        try:
            codes = {}
            async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                codes["health port: Check 100 KiB"] = await check_code(stub, big)
                codes["health port: Watch 100 KiB"] = await code_of(stub.Watch(big, timeout=30))
                codes["health port: Check"] = await check_code(stub, health_pb2.HealthCheckRequest())
            async with grpc.aio.insecure_channel(address) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                codes["Check 100 KiB"] = await check_code(stub, big)
                codes["Watch 100 KiB"] = await code_of(stub.Watch(big, timeout=30))
                watches = [stub.Watch(health_pb2.HealthCheckRequest(service="")) for _ in range(channel.MAX_HEALTH_WATCHES)]
                first = [(await w.read()).status for w in watches]  # each is open and answered
                codes["one Watch too many"] = await code_of(stub.Watch(health_pb2.HealthCheckRequest(), timeout=30))
                watches.pop().cancel()
                status = None
                for _ in range(100):  # the server sees the cancel a moment later: a bounded wait
                    again = stub.Watch(health_pb2.HealthCheckRequest(service=""))
                    try:
                        status = (await again.read()).status
                        break
                    except grpc.aio.AioRpcError:
                        await asyncio.sleep(0.1)
                codes["a Watch after one closed"] = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
                again.cancel()
                for w in watches:
                    w.cancel()
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=channel.LEARNER_SERVICE), timeout=30)
                codes["Check"] = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            return codes, set(first)
        finally:
            await server.stop(None)

    codes, first = asyncio.run(main())
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    assert codes == {"Check 100 KiB": exhausted, "Watch 100 KiB": exhausted, "one Watch too many": exhausted,
                     "a Watch after one closed": "SERVING", "Check": "SERVING",
                     "health port: Check 100 KiB": exhausted, "health port: Watch 100 KiB": exhausted,
                     "health port: Check": grpc.StatusCode.OK}
    assert first == {health_pb2.HealthCheckResponse.SERVING}


@pytest.mark.e2e
def test_plaintext_health_port_answers_health_checks_and_nothing_else(pki):
    """With TLS on the actor port, probes that cannot speak TLS (the kubelet's)
    use server.health_port; no Learner RPC is reachable there."""
    health_port = free_port()

    async def main():
        server, address, set_serving = await start_server(
            seed_pb2_grpc.LearnerServicer(), "127.0.0.1:0",
            server_config=ServerConfig(health_port=health_port),
            tls=TlsConfig(cert=pki["server.pem"], key=pki["server-key.pem"]),
        )
        await set_serving(True)
        try:
            loop = asyncio.get_running_loop()
            on_health_port = await loop.run_in_executor(None, _call_all, f"127.0.0.1:{health_port}", None)
            with pytest.raises(grpc.aio.AioRpcError) as plaintext:  # the actor port still wants TLS
                await loop.run_in_executor(None, _call_all, address, None)
            return on_health_port, plaintext.value.code()
        finally:
            await server.stop(None)

    on_health_port, plaintext_code = asyncio.run(main())
    assert on_health_port == {"Stream": grpc.StatusCode.UNIMPLEMENTED, "PushUnrolls": grpc.StatusCode.UNIMPLEMENTED,
                              "PullParams": grpc.StatusCode.UNIMPLEMENTED, "health": "SERVING"}
    assert plaintext_code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.e2e
def test_unix_socket_is_owner_only_and_health_reports_not_serving_until_told(tmp_path):
    path = tmp_path / "learner.sock"

    async def main():
        server, address, set_serving = await start_server(seed_pb2_grpc.LearnerServicer(), f"unix:{path}")
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            async with grpc.aio.insecure_channel(address) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                before = (await stub.Check(health_pb2.HealthCheckRequest(service=channel.LEARNER_SERVICE))).status
                await set_serving(True)
                after = (await stub.Check(health_pb2.HealthCheckRequest(service=channel.LEARNER_SERVICE))).status
            return mode, before, after
        finally:
            await server.stop(None)

    from grpc_health.v1 import health_pb2

    mode, before, after = asyncio.run(main())
    assert mode == 0o600
    assert before == health_pb2.HealthCheckResponse.NOT_SERVING
    assert after == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.e2e
def test_binding_a_unix_socket_replaces_only_a_stale_socket(tmp_path):
    """A file that is not a socket, or the socket of a learner still serving,
    is refused in one line and left as it was; a crashed learner's socket
    (nobody listening) is replaced."""
    not_a_socket = tmp_path / "notes.txt"
    not_a_socket.write_text("keep me")
    stale = tmp_path / "stale.sock"
    crashed = socket.socket(socket.AF_UNIX)
    crashed.bind(str(stale))
    crashed.close()  # bound, never listening: what a killed learner leaves

    async def main():
        with pytest.raises(OSError, match="exists and is not a socket"):
            await start_server(seed_pb2_grpc.LearnerServicer(), f"unix:{not_a_socket}")
        first, address, _ = await start_server(seed_pb2_grpc.LearnerServicer(), f"unix:{stale}")
        try:
            with pytest.raises(OSError, match="another process is serving on this socket"):
                await start_server(seed_pb2_grpc.LearnerServicer(), address)
        finally:
            await first.stop(None)

    asyncio.run(main())
    assert not_a_socket.read_text() == "keep me"
    assert not stale.exists()  # removed by the learner that bound it


@pytest.mark.e2e
def test_a_learner_removes_its_own_socket_only(tmp_path):
    """Of two learners that bound one path in turn (the first one's socket file
    was removed meanwhile), the first to stop leaves the second's socket."""
    path = tmp_path / "learner.sock"

    async def main():
        first, _, _ = await start_server(seed_pb2_grpc.LearnerServicer(), f"unix:{path}")
        os.unlink(path)
        second, _, _ = await start_server(seed_pb2_grpc.LearnerServicer(), f"unix:{path}")
        await first.stop(None)
        still_there = path.exists()
        await second.stop(None)
        return still_there

    assert asyncio.run(main()) is True
    assert not path.exists()


@pytest.mark.unit
@pytest.mark.parametrize("address, host", [
    ("unix:/tmp/l.sock", "127.0.0.1"), ("127.0.0.1:50051", "127.0.0.1"), ("0.0.0.0:50051", "0.0.0.0"),
    ("10.0.0.5:50051", "10.0.0.5"), ("[::]:50051", "[::]"),
])
def test_the_health_port_listens_where_the_learner_does(address, host):
    assert channel.health_host(address) == host


@pytest.mark.e2e
def test_certs_command_writes_a_ca_and_keys_only_the_owner_can_read(tmp_path):
    from cryptography import x509

    out = tmp_path / "pki"
    result = subprocess.run([*SEEDQ, "certs", "--out", str(out), "--hosts", "learner-0.learner,10.1.2.3"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for name in ("ca-key.pem", "server-key.pem", "client-key.pem", "token"):
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o600, name
    ca = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    server = x509.load_pem_x509_certificate((out / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    x509.load_pem_x509_certificate((out / "client.pem").read_bytes()).verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["learner-0.learner"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    assert len((out / "token").read_text().strip()) >= 32


@pytest.mark.e2e
def test_bad_credential_files_are_one_line_errors(tmp_path):
    result = subprocess.run([*SEEDQ, "actor", "--server", "127.0.0.1:1", "--env", "CartPole-v1",
                             "--tls.ca", str(tmp_path / "missing.pem")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == f"seedq actor: --tls.ca {tmp_path / 'missing.pem'}: No such file or directory"


# --- real processes over TCP loopback ---


@pytest.mark.e2e
def test_token_over_tcp_wrong_actor_refused_while_two_actors_train(tmp_path, pki):
    token = pki["token"]
    # A frame budget, not a return: the refusals and the training the two
    # token-holding actors feed (--min-actors 2) are the property here.
    learner, address, log, run = start_learner(
        tmp_path, "token", "--auth.token-file", token, "--min-actors", "2",
        "--max-frames", "40000", "--max-seconds", "0", "--target-return", "none",
    )
    intruder = start_actor(address, "--auth.token-file", pki["wrong-token"], actor_id="intruder")
    anonymous = start_actor(address, actor_id="anonymous")
    actors = [start_actor(address, "--auth.token-file", token, "--retry-max-seconds", "30",
                          actor_id=f"good-{i}") for i in range(2)]
    try:
        out, _ = intruder.communicate(timeout=60)
        assert intruder.returncode != 0
        assert "UNAUTHENTICATED" in out and len(out.strip().splitlines()) == 1, out
        out, _ = anonymous.communicate(timeout=60)
        assert anonymous.returncode != 0 and "UNAUTHENTICATED" in out, out
        learner.wait(timeout=540)
    finally:
        stop(learner, intruder, anonymous, *actors)
    assert learner.returncode == 0, _text(log)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "max_frames" and summary["frames"] >= 40000, summary
    assert summary["train_steps"] > 0
    # Refusals logged once per peer host (both refused actors came from 127.0.0.1).
    assert _text(log).count("missing or wrong bearer token") == 1, _text(log)


@pytest.mark.e2e
def test_mutual_tls_refuses_actors_without_a_trusted_client_certificate(tmp_path, pki):
    tls = ["--tls.cert", pki["server.pem"], "--tls.key", pki["server-key.pem"],
           "--tls.client-ca", pki["ca.pem"]]
    # Runs until SIGTERM (the `seedq learner` preemption path): no frame, time or return limit.
    learner, address, log, run = start_learner(
        tmp_path, "mtls", *tls, "--auth.token-file", pki["token"], "--max-frames", "0",
        "--max-seconds", "0", "--target-return", "none", "--checkpoint-every-seconds", "0",
    )
    token = ["--auth.token-file", pki["token"]]
    client = ["--tls.cert", pki["client.pem"], "--tls.key", pki["client-key.pem"]]
    refused = {
        "no client certificate": start_actor(address, *token, "--tls.ca", pki["ca.pem"], actor_id="a"),
        "foreign client certificate": start_actor(
            address, *token, "--tls.ca", pki["ca.pem"], "--tls.cert", pki["foreign-client.pem"],
            "--tls.key", pki["foreign-client-key.pem"], actor_id="b"),
        "untrusted learner certificate": start_actor(
            address, *token, *client, "--tls.ca", pki["foreign-ca.pem"], actor_id="c"),
        "plaintext": start_actor(address, *token, actor_id="d"),
        "wrong token": start_actor(address, "--auth.token-file", pki["wrong-token"], *client,
                                   "--tls.ca", pki["ca.pem"], actor_id="e"),
    }
    good = start_actor(address, *token, *client, "--tls.ca", pki["ca.pem"], "--retry-max-seconds", "30",
                       actor_id="good")
    try:
        for what, proc in refused.items():
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode != 0 and "UNAUTHENTICATED" in out, (what, out)
            assert len(out.strip().splitlines()) == 1, (what, out)
        wait_for(lambda: frames_logged(log) > 20000, 180, "the trusted actor's frames", learner, log)
        assert good.poll() is None  # undisturbed by the refusals
        learner.send_signal(signal.SIGTERM)
        learner.wait(timeout=120)
    finally:
        stop(learner, good, *refused.values())
    assert learner.returncode == 143, _text(log)  # SIGTERM: checkpoint, then exit 143 (restart me)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "terminated" and summary["frames"] > 20000
    assert os.path.isdir(summary["checkpoint"]) and summary["train_steps"] > 0
    print(f"mTLS run: {len(refused)} actors refused, trusted actor {summary['frames']:,} frames; "
          f"SIGTERM -> rc {learner.returncode}, checkpoint {os.path.basename(summary['checkpoint'])}")


@pytest.mark.e2e
def test_idle_watchdog_closes_only_streams_waiting_on_a_silent_actor():
    async def main():
        loop = asyncio.get_running_loop()
        dog = channel.IdleWatchdog(timeout=0.3)

        async def silent_actor():  # the learner waits for a message that never comes
            task = dog.register("actor silent")
            dog.waiting(task, loop.time())
            await asyncio.sleep(30)

        async def busy_learner():  # the learner itself is slow (inference, backpressure)
            task = dog.register("actor busy")
            dog.waiting(task, loop.time())
            dog.heard(task)
            await asyncio.sleep(1.5)
            return "served"

        silent, busy = asyncio.create_task(silent_actor()), asyncio.create_task(busy_learner())
        done = await asyncio.gather(silent, busy, return_exceptions=True)
        dog.close()
        return done

    silent, busy = asyncio.run(main())
    assert isinstance(silent, asyncio.CancelledError)
    assert busy == "served"


@pytest.mark.unit
def test_certs_never_write_a_key_into_a_file_others_can_read(tmp_path, monkeypatch):
    """A key file left world-readable by an earlier run is replaced by a new
    0600 file, not rewritten in place and restricted afterwards: at each
    write of key material the file written to is already owner-only."""
    out = tmp_path / "pki"
    out.mkdir()
    for name in ("ca-key.pem", "server-key.pem", "client-key.pem", "token"):
        (out / name).write_text("old")
        os.chmod(out / name, 0o644)
    modes_at_write = []
    real_fdopen = os.fdopen

    def fdopen(fd, *args, **kwargs):
        modes_at_write.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_fdopen(fd, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", fdopen)
    paths = certs_lib.make(str(out), hosts=("localhost",), replace=True)
    monkeypatch.undo()
    assert modes_at_write.count(0o600) >= 4 and set(modes_at_write) <= {0o600, 0o644}
    for name in ("ca-key.pem", "server-key.pem", "client-key.pem", "token"):
        assert stat.S_IMODE(os.stat(paths[name] if name in paths else out / name).st_mode) == 0o600


@pytest.mark.unit
def test_certs_refuse_to_replace_a_cluster_ca_unless_told(tmp_path, capsys):
    """A new CA key over the old one would untrust every certificate the old
    CA signed: `seedq certs` refuses (one line, exit 2, nothing written)
    unless --replace says so."""
    from seedq import cli

    out = tmp_path / "pki"
    assert cli.main(["certs", "--out", str(out)]) == 0
    before = {name: (out / name).read_bytes() for name in certs_lib.FILES}
    capsys.readouterr()
    assert cli.main(["certs", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "ca-key.pem" in err and "--replace" in err and len(err.strip().splitlines()) == 1
    assert {name: (out / name).read_bytes() for name in certs_lib.FILES} == before
    assert sorted(os.listdir(out)) == sorted(certs_lib.FILES)  # no temporary file left either
    assert cli.main(["certs", "--out", str(out), "--replace"]) == 0
    assert (out / "ca-key.pem").read_bytes() != before["ca-key.pem"]
