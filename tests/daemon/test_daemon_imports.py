"""What a koordlet loads: standalone, no aiohttp and no Kubernetes client (its server is asyncio
plus httptools, koordlet.server.http), neither at import nor through a real start that serves
/metrics; in cluster mode no aiohttp either (kubeclient.transport speaks HTTP/1.1 itself).
Imports are process-wide, so each check runs in a fresh interpreter; the started daemon is
probed over a raw socket, not with an HTTP client that would load a library itself."""

from __future__ import annotations

from pathlib import Path

from tests.freshinterp import run_json

CLUSTER_ONLY = (
    "aiohttp",
    "kubeclient.client",
    "kubeclient.transport",
    "koordlet.statesinformer.kubelet",
)
"""Not loaded by a standalone koordlet (aiohttp by none at all)."""
NEVER = ("aiohttp", "kubernetes_asyncio", "yarl", "prometheus_client", "grpc")
"""Not loaded by the cluster-mode modules either (prometheus-client's package imports its HTTP
and WSGI servers; the koordlet's families are koordlet.prom's)."""


KEPT_OUT = ("yaml", "tempfile", "decimal")
"""Not imported by the cluster-mode modules: PyYAML parses a kubeconfig in a child process
(kubeclient.config) and a kubelet config only when one is read; state files are replaced by
koordlet.system.atomicfile, not through tempfile (with shutil, bz2, lzma); decimal only when an
io or blkio parameter is written (koordlet.system.devcodec)."""


def _loaded(modules: list[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == r or m.startswith(r + ".") for r in roots))


def test_importing_the_daemon_loads_no_aiohttp() -> None:
    modules = run_json("import json, sys, koordlet.daemon; print(json.dumps(sorted(sys.modules)))")
    assert _loaded(modules, CLUSTER_ONLY) == []
    assert _loaded(modules, NEVER) == []
    assert _loaded(modules, KEPT_OUT) == []
    assert "koordlet.server.http" in modules


def test_the_cluster_mode_modules_and_the_hook_server_load_no_aiohttp_or_grpcio() -> None:
    modules = run_json(
        "import json, sys, koordlet.daemon, koordlet.daemon.cluster\n"
        "from koordlet.statesinformer import kube, kubelet\n"
        "from koordlet.reporter import nodemetric, topology, predictor, evictioncondition\n"
        "import kubeclient.client, kubeclient.informer, koordlet.runtimehooks.hookserver\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    assert _loaded(modules, NEVER) == []
    assert _loaded(modules, KEPT_OUT) == []
    assert "kubeclient.transport" in modules


def test_a_standalone_start_serves_metrics_without_loading_aiohttp(tmp_path: Path) -> None:
    result = run_json(
        f"""
        import asyncio, json, socket, sys
        from koordlet import daemon
        from koordlet.config import CgroupConfig, CollectConfig, KoordletConfig, QoSConfig
        from koordlet.config import RuntimeHooksConfig, ServerConfig
        from koordlet.system.cgroups import CgroupDriver, CgroupVersion
        from tests.fakehost import FakeHost

        fake = FakeHost({str(tmp_path)!r}, CgroupVersion.V1, CgroupDriver.CGROUPFS)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = KoordletConfig(
            node_name="node-1", paths=fake.paths,
            cgroup=CgroupConfig(version="v1", driver="cgroupfs"),
            collect=CollectConfig(res_used_interval=0.1),
            server=ServerConfig(addr=f"127.0.0.1:{{port}}"), standalone=True,
            state_dir={str(tmp_path / "state")!r}, qos=QoSConfig(),
            runtime_hooks=RuntimeHooksConfig(addr="", nri=False),
        )

        async def get(path):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = f"GET {{path}} HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n"
            writer.write(head.encode())
            data = await reader.read()
            writer.close()
            return data.split(b" ", 2)[1].decode(), data.partition(b"\\r\\n\\r\\n")[2]

        async def main():
            stop = asyncio.Event()
            task = asyncio.create_task(daemon.run(cfg, stop=stop), name="daemon")
            async with asyncio.timeout(20):
                while True:
                    try:
                        if (await get("/readyz"))[0] == "200":
                            break
                    except OSError:
                        pass
                    await asyncio.sleep(0.05)
                status, body = await get("/metrics")
            stop.set()
            code = await task
            return {{"code": code, "metrics": status, "has_families": b"koordlet_" in body,
                    "modules": sorted(sys.modules)}}

        print(json.dumps(asyncio.run(main())))
        """
    )
    assert result["code"] == 0
    assert result["metrics"] == "200"
    assert result["has_families"]
    assert _loaded(result["modules"], CLUSTER_ONLY) == []
    assert _loaded(result["modules"], NEVER) == []
    assert _loaded(result["modules"], ("decimal", "_decimal", "yaml")) == []
    assert "httptools" in result["modules"]


def test_serving_on_an_address_loads_no_idna_codec() -> None:
    # uvloop encodes a str host with the "idna" codec (stringprep, unicodedata); the server
    # hands it ASCII bytes. A real bind on loopback, then the modules.
    result = run_json(
        """
        import json, sys, uvloop
        from koordlet.server.connection import HttpServer

        async def main():
            server = HttpServer(app=None)
            await server.start("127.0.0.1", 0)
            where = server.addresses
            await server.stop()
            return where

        where = uvloop.run(main())
        print(json.dumps({"where": where, "modules": sorted(sys.modules)}))
        """
    )
    assert result["where"][0][0] == "127.0.0.1"
    assert _loaded(result["modules"], ("encodings.idna", "stringprep")) == []
