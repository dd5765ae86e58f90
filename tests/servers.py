"""Real servers the integration tests start themselves, each skipping the test with the reason where it
cannot exist here: a single-node Slurm (../shared/tools/slurm-localhost), the Kubernetes emulator
(../shared/tools/fakekube) and a PostgreSQL server (Debian's postgresql). Their fixtures are in
conftest.py."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import sqlalchemy

REPO = Path(__file__).resolve().parents[1]

# -- Slurm -------------------------------------------------------------------------------------

TOOL = REPO.parent / "shared" / "tools" / "slurm-localhost"
SLURM_BASE = "/var/tmp/slurm-localhost"


def start_slurm() -> None:
    """Start (or find running) the real single-node Slurm of ../shared/tools/slurm-localhost; skip the
    test where it cannot exist."""
    if not (TOOL / "start-slurm.sh").is_file():
        pytest.skip(f"{TOOL}/start-slurm.sh not found (the shared test tools are not beside the checkout)")
    if os.geteuid() != 0:
        pytest.skip("starting a real Slurm needs root")
    # The tool writes its install log there before creating it.
    os.makedirs(SLURM_BASE, exist_ok=True)
    started = subprocess.run(
        ["bash", str(TOOL / "start-slurm.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"SLURM_BASE": SLURM_BASE},
    )
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]


def slurm_queue() -> list[dict]:
    """Every job in Slurm's queue (finished ones too, for MinJobAge): job_id, state, workdir, comment."""
    result = subprocess.run(
        ["squeue", "-h", "-o", "%i|%T|%Z|%k"], capture_output=True, text=True, check=True, timeout=30
    )
    rows = (line.split("|", 3) for line in result.stdout.splitlines())
    return [dict(zip(("job_id", "state", "workdir", "comment"), row, strict=True)) for row in rows]


# -- Kubernetes (fakekube, with the EIDF GPU service's admission rules) ---------------------------

FAKEKUBE = REPO.parent / "shared" / "tools" / "fakekube" / "fakekube.py"
NAMESPACE = "eidf001ns"  # EIDF namespaces are <project>ns; the LocalQueue is <namespace>-user-queue
GPU_PRODUCT = "NVIDIA-A100-SXM4-40GB"


def fakekube_missing() -> str | None:
    if not FAKEKUBE.is_file():
        return f"the Kubernetes emulator is not at {FAKEKUBE}"
    if shutil.which("openssl") is None:
        return "fakekube needs the openssl command for its certificates"
    if importlib.util.find_spec("kubernetes_validate") is None:
        return "fakekube needs kubernetes-validate (requirements-dev.txt)"
    return None


class FakeKube:
    """A running fakekube and an API client of it; ``claims`` maps claim names to host directories."""

    def __init__(self, base: Path, claims: dict[str, Path]):
        self.claims = claims
        base.mkdir(parents=True, exist_ok=True)
        self.kubeconfig, self.state_dir, self.log = base / "kubeconfig", base / "state", base / "fakekube.log"
        # Pods run as local processes with fakekube's environment: `python` is this environment's.
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        command = [
            sys.executable, str(FAKEKUBE), "--port", "0", "--state-dir", str(self.state_dir),
            "--kubeconfig", str(self.kubeconfig), "--context-namespace", NAMESPACE, "--eidf",
            "--node", f"name=gpu-a100-0,cpu=16,memory=256Gi,gpus=4,gpu-product={GPU_PRODUCT},gpu-memory=40960",
            "--node", "name=cpu-0,cpu=8,memory=32Gi",
            "--kueue-admit-delay", "0.2", "--backoff-scale", "0.05",
        ]  # fmt: skip
        for claim, directory in claims.items():
            command += ["--pvc", f"{claim}={directory}"]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while not self.kubeconfig.exists():  # written once the server listens
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("fakekube did not start:\n" + self.log.read_text())
            time.sleep(0.05)
        import kubernetes

        self.api = kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))
        self.batch = kubernetes.client.BatchV1Api(self.api)

    def state(self) -> dict:
        """fakekube's record of policy denials, unknown-field warnings and API calls."""
        return self.api.call_api(
            "/fakekube/state", "GET", auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True
        )

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)  # stops the pods' processes, then the server
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# -- PostgreSQL --------------------------------------------------------------------------------

POSTGRES_USER = "mlcampaign"
POSTGRES_ADMIN = "mlcampaign_admin"


def _postgres_bindir() -> Path | None:
    """The directory of the newest installed PostgreSQL server's initdb and pg_ctl."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if candidates:
        return candidates[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclasses.dataclass
class PostgresServer:
    port: int
    password: str  # of POSTGRES_USER
    admin: sqlalchemy.Engine  # a superuser connection, autocommit
    databases: int = 0

    def new_database(self) -> str:
        self.databases += 1
        name = f"store{self.databases}"
        with self.admin.connect() as connection:
            connection.exec_driver_sql(f"CREATE DATABASE {name} OWNER {POSTGRES_USER}")
        return name


@contextlib.contextmanager
def postgres_server():
    """A PostgreSQL server of Debian's postgresql package, in a temporary directory on a free port,
    password authentication over TCP; run as the `postgres` system user when the tests run as root."""
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip("the PostgreSQL server (initdb, pg_ctl) is not installed (Debian: apt-get install postgresql)")
    as_root = os.geteuid() == 0
    if as_root:
        try:
            server_user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root, and there is no 'postgres' system user to run the PostgreSQL server as")
    directory = Path(tempfile.mkdtemp(prefix="mlcampaign-postgres-"))
    run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
    admin_password, user_password = "admin-secret", "store-secret"
    password_file = directory / "admin-password"
    password_file.write_text(admin_password)
    if as_root:
        for path in (directory, password_file):
            os.chown(path, server_user.pw_uid, server_user.pw_gid)
    data = directory / "data"
    subprocess.run(
        [*run_as, str(bindir / "initdb"), "-D", str(data), "-U", POSTGRES_ADMIN, "--pwfile", str(password_file),
         "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg_ctl = [*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(directory / "server.log")]
    subprocess.run([*pg_ctl, "-w", "-t", "60", "-o", options, "start"], check=True, capture_output=True)
    admin_url = f"postgresql+psycopg://{POSTGRES_ADMIN}:{admin_password}@127.0.0.1:{port}/postgres"
    import sqlalchemy

    admin = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"CREATE ROLE {POSTGRES_USER} LOGIN PASSWORD '{user_password}'")
        yield PostgresServer(port, user_password, admin)
    finally:
        admin.dispose()
        subprocess.run([*pg_ctl, "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)
