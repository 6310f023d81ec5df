"""packaging/image.py: the image's configuration is the Dockerfile's; the archive is a valid OCI
image layout (every digest and size as its index, manifest and config say); a rebuild from the
cache is the same image; a real containerd imports it and its containers, created through the
CRI as the kubelet creates them, run every component.

The OCI image-layout and manifest rules: github.com/opencontainers/image-spec image-layout.md,
manifest.md and config.md (v1.0.2).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import grpc
import pytest
from google.protobuf import unknown_fields
from google.protobuf.message import Message

from apis.cri.v1 import api_pb2 as cri
from tests import projectimage
from tests.runtimehooks.containerd import Containerd
from tests.runtimehooks.containerd import why_not as why_no_containerd

REPO = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("koordpy_image", REPO / "packaging/image.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


image = _script()


# The configuration, against the Dockerfile -----------------------------------------------------


def _dockerfile_final_stage() -> dict[str, list[str]]:
    """Instruction -> its arguments (continuation lines joined), for the last FROM's stage."""
    text = (REPO / "packaging/Dockerfile").read_text()
    lines: list[str] = []
    for raw in text.splitlines():
        if raw.lstrip().startswith("#"):
            continue
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + raw.strip()
        elif raw.strip():
            lines.append(raw.strip())
    last_from = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    out: dict[str, list[str]] = {}
    for line in lines[last_from + 1 :]:
        op, _, rest = line.partition(" ")
        out.setdefault(op, []).append(rest.strip())
    return out


def test_the_image_configuration_is_the_dockerfiles() -> None:
    stage = _dockerfile_final_stage()
    cfg = image.image_config([], image.project()["version"], 0)["config"]
    (entrypoint,) = stage["ENTRYPOINT"]
    (cmd,) = stage["CMD"]
    assert cfg["Entrypoint"] == json.loads(entrypoint)
    assert cfg["Cmd"] == json.loads(cmd)
    assert stage["USER"] == [cfg["User"]]
    assert {f"{p}/tcp" for p in stage["EXPOSE"]} == set(cfg["ExposedPorts"])
    (labels,) = stage["LABEL"]
    assert dict(kv.split("=", 1) for kv in shlex.split(labels)) == cfg["Labels"]
    (env_line,) = stage["ENV"]
    docker_env = dict(kv.split("=", 1) for kv in shlex.split(env_line))
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert docker_env.keys() == env.keys()
    for key, value in docker_env.items():
        if "$PATH" in value:  # the base's own PATH after ours: /opt/koordinator/bin first
            assert env[key].startswith(value.replace("$PATH", "")), key
            assert env[key].endswith(":/usr/bin:/sbin:/bin"), key
        else:
            assert env[key] == value, key
    assert cfg["Labels"]["org.opencontainers.image.version"] == image.project()["version"]


def test_the_default_ref_is_a_loopback_registry_name_of_the_project_version() -> None:
    ref = image.default_ref()
    assert ref == f"127.0.0.1:5999/koordinator-py/koordinator:{image.project()['version']}"
    assert image.REF.fullmatch(ref)


@pytest.mark.parametrize(
    "ref", ["koordinator", "127.0.0.1:5999/koordinator-py/koordinator", "Host/Upper:1", "x/y:"]
)
def test_a_ref_without_a_registry_host_or_a_tag_is_refused_naming_the_flag(
    ref: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "packaging/image.py"), "--out", str(tmp_path / "x.tar"),
         "--ref", ref],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"--ref {ref!r} is not HOST[:PORT]/PATH:TAG" in done.stderr
    assert not (tmp_path / "x.tar").exists()


# The archive ------------------------------------------------------------------------------------


def _read(t: tarfile.TarFile, name: str) -> bytes:
    f = t.extractfile(name)
    assert f is not None, name
    return f.read()


def _sha256(f: IO[bytes]) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
        n += len(chunk)
    return "sha256:" + h.hexdigest(), n


def _blob(t: tarfile.TarFile, digest: str) -> IO[bytes]:
    f = t.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
    assert f is not None, digest
    return f


def _layer_members(t: tarfile.TarFile, digest: str) -> Iterator[tarfile.TarInfo]:
    with tarfile.open(fileobj=_blob(t, digest), mode="r|") as layer:
        yield from layer


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_archive_is_an_oci_layout_whose_every_digest_and_size_match(
    project_image: projectimage.Built,
) -> None:
    with tarfile.open(project_image.archive) as t:
        assert json.loads(_read(t, "oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        # every blob is named by the sha256 of its content
        for member in t.getmembers():
            if member.isfile() and member.name.startswith("blobs/sha256/"):
                f = t.extractfile(member)
                assert f is not None
                assert _sha256(f)[0] == "sha256:" + member.name.rpartition("/")[2]
        index = json.loads(_read(t, "index.json"))
        assert index["schemaVersion"] == 2
        (desc,) = index["manifests"]
        assert desc["mediaType"] == image.MEDIA_MANIFEST
        assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
        assert desc["annotations"]["io.containerd.image.name"] == project_image.ref
        raw = _blob(t, desc["digest"]).read()
        assert len(raw) == desc["size"]
        manifest = json.loads(raw)
        assert manifest["mediaType"] == image.MEDIA_MANIFEST
        assert manifest["config"]["mediaType"] == image.MEDIA_CONFIG
        raw_cfg = _blob(t, manifest["config"]["digest"]).read()
        assert len(raw_cfg) == manifest["config"]["size"]
        config = json.loads(raw_cfg)
        assert (config["architecture"], config["os"]) == ("amd64", "linux")
        version = image.project()["version"]
        assert config["config"] == image.image_config([], version, 0)["config"]
        diff_ids = []
        for layer in manifest["layers"]:
            assert layer["mediaType"] == image.MEDIA_LAYER  # uncompressed: digest == diff ID
            assert _sha256(_blob(t, layer["digest"])) == (layer["digest"], layer["size"])
            diff_ids.append(layer["digest"])
        assert config["rootfs"] == {"type": "layers", "diff_ids": diff_ids}
        assert len(config["history"]) == len(diff_ids)

        base, deps, own = manifest["layers"]
        epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
        files: dict[str, set[str]] = {}
        for which, layer in (("base", base), ("deps", deps), ("own", own)):
            members = list(_layer_members(t, layer["digest"]))
            assert {(m.mtime, m.uname, m.gname) for m in members} == {(epoch, "", "")}, which
            listed = [m.name for m in members]
            assert listed == sorted(listed, key=lambda n: n.split("/")), which  # parents first
            files[which] = {m.name for m in members if not m.isdir()}
        assert {"usr/bin/python3", "usr/bin/openssl", "etc/ssl/certs/ca-certificates.crt"} <= (
            files["base"]
        )
        assert not [n for n in files["base"] if n.startswith(("dev/", "proc/", "tmp/", "run/"))]
        assert not [n for n in files["base"] if n.startswith("usr/share/doc/")]
        assert all(n.startswith("opt/koordinator/") for n in files["deps"] | files["own"])
        # the project's layer adds files (and writes their folders again), replaces none
        assert {f"opt/koordinator/bin/{c}" for c in image.COMPONENTS} <= files["own"]
        assert not files["own"] & files["deps"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_rebuild_from_the_cache_is_the_same_image(
    project_image: projectimage.Built, tmp_path: Path
) -> None:
    if not project_image.summary:
        pytest.skip("KOORDPY_IMAGE was given: nothing was built here to compare with")
    again = projectimage.build(tmp_path)
    assert again.summary["cached"] == {"base": True, "wheels": True, "deps": True}
    assert again.summary["manifest_digest"] == project_image.summary["manifest_digest"]
    assert again.archive.read_bytes() == project_image.archive.read_bytes()


# A real containerd ------------------------------------------------------------------------------

_NO_CTRD = why_no_containerd()


def _exit_code(status: cri.ContainerStatus) -> int:
    """``ContainerStatus.exit_code``: field 7 (int32) in the CRI's api.proto (k8s.io/cri-api
    v1), which the project's trimmed messages do not declare; protobuf keeps it as an unknown
    field."""
    for f in unknown_fields.UnknownFieldSet(status):
        if f.field_number == 7 and f.wire_type == 0:
            code = int(f.data)
            return code - (1 << 64) if code >= 1 << 63 else code
    return 0  # proto3: a zero is not on the wire


class _Cri:
    """The CRI calls the kubelet makes, straight to containerd."""

    def __init__(self, ctrd: Containerd, logs: Path) -> None:
        self.ctrd, self.logs = ctrd, logs
        self.sandboxes: list[str] = []

    async def call(self, service: str, method: str, req: Message, resp_type: type[Any]) -> Any:
        async with grpc.aio.insecure_channel(f"unix://{self.ctrd.socket}") as channel:
            path = f"/runtime.v1.{service}/{method}"
            data = await channel.unary_unary(path)(req.SerializeToString(), timeout=120)
        return resp_type.FromString(data)

    async def sandbox(self) -> tuple[str, cri.PodSandboxConfig]:
        uid = str(uuid.uuid4())
        rel = f"besteffort/pod{uid}"
        self.ctrd.make_pod_cgroup(rel)
        cfg = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=f"image-{uid[:8]}", namespace="default", uid=uid),
            log_directory=str(self.logs),
        )
        cfg.linux.cgroup_parent = f"/{self.ctrd.cgroup_prefix}/{rel}"
        ns = cfg.linux.security_context.namespace_options
        ns.network, ns.pid = cri.NODE, cri.CONTAINER
        resp = await self.call(
            "RuntimeService", "RunPodSandbox", cri.RunPodSandboxRequest(config=cfg),
            cri.RunPodSandboxResponse,
        )  # fmt: skip
        self.sandboxes.append(resp.pod_sandbox_id)
        return resp.pod_sandbox_id, cfg

    async def run(
        self, sandbox: tuple[str, cri.PodSandboxConfig], ref: str, name: str, command: list[str]
    ) -> tuple[int, str]:
        """A container with ``command`` (the Pod's ``command``: the image's entrypoint replaced),
        started and waited for; its exit code and output."""
        sid, scfg = sandbox
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name),
            image=cri.ImageSpec(image=ref),
            command=command[:1],
            args=command[1:],
            log_path=f"{name}.log",
        )
        req = cri.CreateContainerRequest(pod_sandbox_id=sid, config=config, sandbox_config=scfg)
        created = await self.call(
            "RuntimeService", "CreateContainer", req, cri.CreateContainerResponse
        )
        cid = created.container_id
        await self.call(
            "RuntimeService", "StartContainer", cri.StartContainerRequest(container_id=cid),
            cri.StartContainerResponse,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            status = await self.call(
                "RuntimeService", "ContainerStatus", cri.ContainerStatusRequest(container_id=cid),
                cri.ContainerStatusResponse,
            )  # fmt: skip
            if status.status.state == cri.CONTAINER_EXITED:
                break
            assert time.monotonic() < deadline, f"{name} still running after 120 s"
            await asyncio.sleep(0.1)
        # the CRI log format: "<time> <stream> <P|F> <text>" a line
        lines = (self.logs / f"{name}.log").read_text().splitlines()
        text = "\n".join(line.split(" ", 3)[3] for line in lines if line.count(" ") >= 3)
        return _exit_code(status.status), text

    async def cleanup(self) -> None:
        for sid in self.sandboxes:
            try:
                stop = cri.StopPodSandboxRequest(pod_sandbox_id=sid)
                await self.call(
                    "RuntimeService", "StopPodSandbox", stop, cri.StopPodSandboxResponse
                )
                await self.call(
                    "RuntimeService", "RemovePodSandbox",
                    cri.RemovePodSandboxRequest(pod_sandbox_id=sid), cri.RemovePodSandboxResponse,
                )  # fmt: skip
            except grpc.aio.AioRpcError as err:  # Containerd.close still removes it all
                print(f"cleanup of sandbox {sid}: {err.details()}")


_IMPORT_EVERYTHING = """
import importlib, pkgutil
n = 0
for top in ("apis", "kubeclient", "koordlet", "manager", "scheduler_plugins", "runtimeproxy",
            "descheduler"):
    for m in pkgutil.walk_packages(importlib.import_module(top).__path__, top + "."):
        if not m.name.endswith(".__main__"):  # those run their command
            importlib.import_module(m.name)
            n += 1
print("imported", n, "modules")
from koordlet.system import nativeread
print("native column reads", nativeread.load()[1])
"""


@pytest.mark.slow
@pytest.mark.containerd
@pytest.mark.realcgroup
@pytest.mark.skipif(_NO_CTRD is not None, reason=f"containerd cannot run here: {_NO_CTRD}")
@pytest.mark.timeout(1200)
async def test_containerd_imports_the_image_and_its_containers_run_every_component(
    project_image: projectimage.Built,
) -> None:
    root = Path(tempfile.mkdtemp(prefix="koordtest-image-"))
    ctrd = Containerd(root)
    runtime = _Cri(ctrd, root / "logs")
    try:
        await asyncio.to_thread(ctrd.start)
        imported = await asyncio.to_thread(
            subprocess.run,
            ["ctr", "--address", ctrd.socket, "--namespace", "k8s.io", "images", "import",
             "--snapshotter", "native", str(project_image.archive)],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert imported.returncode == 0, imported.stderr
        # the CRI's image service lists it under its name: the kubelet's ImageStatus finds it
        # and, with imagePullPolicy IfNotPresent, pulls nothing
        listed = await runtime.call(
            "ImageService", "ListImages", cri.ListImagesRequest(), cri.ListImagesResponse
        )
        assert [project_image.ref] in [list(i.repo_tags) for i in listed.images]
        sandbox = await runtime.sandbox()
        # as the DaemonSet runs it: `command: [koordlet]` (found on the image's PATH)
        code, out = await runtime.run(
            sandbox, project_image.ref, "koordlet", ["koordlet", "--help"]
        )
        assert code == 0, out
        assert out.startswith("usage: koordlet")
        # the rest through a shell (each container costs a copy of the image's files with the
        # native snapshotter): the other components, the webhook's openssl, every module
        script = (
            "set -e; for c in koord-manager koord-scheduler koord-descheduler "
            'koord-runtime-proxy; do $c --help | head -n 1; done; openssl version; python -c "$0"'
        )
        code, out = await runtime.run(
            sandbox, project_image.ref, "rest", ["sh", "-c", script, _IMPORT_EVERYTHING]
        )
        assert code == 0, out
        first_lines = out.splitlines()
        assert [line.split()[:2] for line in first_lines[:4]] == [
            ["usage:", "koord-manager"],
            ["usage:", "koord-scheduler"],
            ["usage:", "koord-descheduler"],
            ["usage:", "koord-runtime-proxy"],
        ]
        assert first_lines[4].startswith("OpenSSL 3.")
        assert first_lines[5].startswith("imported ")
        assert int(first_lines[5].split()[1]) > 300
        # the koordlet's native column reader, built with the wheel, loads in the image
        if shutil.which("gcc") or shutil.which("cc"):
            assert first_lines[6].startswith("native column reads on: /opt/koordinator/"), out
    finally:
        await runtime.cleanup()
        print(ctrd.log_tail(15))
        await asyncio.to_thread(ctrd.close)
