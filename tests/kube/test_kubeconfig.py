"""Reading a kubeconfig or the in-cluster account as client-go does (clientcmd), refusing what
the client does not support with the field named."""

from __future__ import annotations

import asyncio
import base64
import logging
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeclient.auth import BearerToken, run_exec_plugin
from kubeclient.config import in_cluster_config, load_sync, parse_kubeconfig
from kubeclient.errors import ConfigError


def kubeconfig(
    path: Path,
    *,
    cluster: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    current: str = "ctx",
    extra: dict[str, Any] | None = None,
) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://api.test:6443"}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": "t0k"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": current,
        **(extra or {}),
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_a_token_kubeconfig_gives_the_server_its_port_and_the_token(tmp_path: Path) -> None:
    cfg = parse_kubeconfig(str(kubeconfig(tmp_path / "kc")))

    assert (cfg.server, cfg.hostname, cfg.port, cfg.tls) == (
        "https://api.test:6443",
        "api.test",
        6443,
        True,
    )
    assert cfg.token == "t0k"
    assert cfg.source == f"kubeconfig {tmp_path / 'kc'}"


def test_file_paths_are_relative_to_the_kubeconfig_that_names_them(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = kubeconfig(
        tmp_path / "sub" / "kc",
        cluster={"server": "https://10.0.0.1", "certificate-authority": "pki/ca.crt"},
        user={"client-certificate": "pki/me.crt", "client-key": "/abs/me.key", "tokenFile": "t"},
    )

    cfg = parse_kubeconfig(str(path))

    assert cfg.ca_file == str(tmp_path / "sub" / "pki" / "ca.crt")
    assert cfg.client_cert_file == str(tmp_path / "sub" / "pki" / "me.crt")
    assert cfg.client_key_file == "/abs/me.key"
    assert cfg.token_file == str(tmp_path / "sub" / "t")
    assert cfg.port == 443


def test_inline_data_is_base64_decoded(tmp_path: Path) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    b64 = base64.b64encode(pem).decode()
    path = kubeconfig(
        tmp_path / "kc",
        cluster={"server": "https://h", "certificate-authority-data": b64},
        user={"client-certificate-data": b64, "client-key-data": b64},
    )

    cfg = parse_kubeconfig(str(path))

    assert cfg.ca_data == pem.decode()
    assert cfg.client_cert_data == pem
    assert cfg.client_key_data == pem


@pytest.mark.parametrize(
    ("user", "field", "says"),
    [
        ({"exec": {"command": "aws"}}, "users[u].user.exec.apiVersion", "must be one of"),
        (
            {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": "x",
                    "interactiveMode": "Always",
                }
            },
            "users[u].user.exec.interactiveMode",
            "no terminal",
        ),
        ({"auth-provider": {"name": "gcp"}}, "users[u].user.auth-provider", "auth-provider"),
        ({"username": "a"}, "users[u].user.username", "basic authentication"),
        ({"token": "t", "as": "someone"}, "users[u].user.as", "impersonation"),
        ({"tokne": "t"}, "users[u].user.tokne", "unknown field"),
        ({"client-certificate": "/c.crt"}, "users[u].user.client-key", "needs both"),
        ({"client-key-data": "!!"}, "users[u].user.client-key-data", "not base64"),
    ],
    ids=[
        "exec-no-version",
        "exec-interactive",
        "auth-provider",
        "basic",
        "impersonation",
        "typo",
        "cert-no-key",
        "bad-base64",
    ],
)
def test_what_is_not_supported_is_refused_naming_the_field(
    tmp_path: Path, user: dict[str, Any], field: str, says: str
) -> None:
    path = kubeconfig(tmp_path / "kc", user=user)

    with pytest.raises(ConfigError) as caught:
        parse_kubeconfig(str(path))

    assert caught.value.source == f"kubeconfig {path}"
    assert caught.value.field == field
    assert says in caught.value.message


@pytest.mark.parametrize(
    ("cluster", "current", "field"),
    [
        ({"server": "https://h", "proxy-url": "http://p"}, "ctx", "clusters[c].cluster.proxy-url"),
        ({"server": "api.test:6443"}, "ctx", "clusters[c].cluster.server"),
        ({"server": "https://h", "insecure-skip-tls-verify": "yes"}, "ctx",
         "clusters[c].cluster.insecure-skip-tls-verify"),
        ({"server": "https://h"}, "", "current-context"),
        ({"server": "https://h"}, "other", "current-context"),
    ],
    ids=["proxy", "no-scheme", "skip-not-bool", "no-current", "unknown-context"],
)  # fmt: skip
def test_a_cluster_or_context_that_does_not_fit_names_its_field(
    tmp_path: Path, cluster: dict[str, Any], current: str, field: str
) -> None:
    path = kubeconfig(tmp_path / "kc", cluster=cluster, current=current)

    with pytest.raises(ConfigError) as caught:
        parse_kubeconfig(str(path))

    assert caught.value.field == field


def test_a_file_that_is_not_a_kubeconfig_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "kc"
    bad.write_text("clusters: 3\n")

    with pytest.raises(ConfigError) as caught:
        parse_kubeconfig(str(bad))

    assert str(caught.value).startswith(f"kubeconfig {bad}: clusters: must be a list")


def test_several_files_merge_and_the_first_to_name_an_entry_wins(tmp_path: Path) -> None:
    first = kubeconfig(
        tmp_path / "a", cluster={"server": "https://first"}, user={"token": "first"}, current=""
    )
    second = kubeconfig(tmp_path / "b", cluster={"server": "https://second"}, current="ctx")

    cfg = load_sync(None, {"KUBECONFIG": f"{first}:{tmp_path / 'missing'}:{second}"})

    assert cfg.server == "https://first"  # the first file's cluster "c"
    assert cfg.token == "first"  # and its user "u"; the current context from the second


def test_the_in_cluster_account_reads_the_service_host_the_token_file_and_the_ca(
    tmp_path: Path,
) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_text("ca")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}

    cfg = in_cluster_config(env, str(tmp_path))

    assert cfg.server == "https://[fd00::1]:443"
    assert (cfg.hostname, cfg.port) == ("fd00::1", 443)
    assert cfg.token_file == str(tmp_path / "token")
    assert cfg.ca_file == str(tmp_path / "ca.crt")


def test_outside_a_pod_without_a_kubeconfig_the_error_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_sync(None, {})

    assert caught.value.source == "--kubeconfig"
    assert "KUBERNETES_SERVICE_HOST" in caught.value.message


def _plugin(tmp_path: Path, status: str, api: str = "client.authentication.k8s.io/v1") -> Path:
    """An exec credential plugin that counts its runs and prints an ExecCredential."""
    plugin = tmp_path / "plugin"
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import json, os, pathlib\n"
        "runs = pathlib.Path(os.environ['RUNS'])\n"
        "runs.write_text(str(int(runs.read_text() or 0) + 1) if runs.exists() else '1')\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['kind'] == 'ExecCredential' and info['spec']['interactive'] is False\n"
        f"cred = {{'apiVersion': {api!r}, 'kind': 'ExecCredential', 'status': {status}}}\n"
        "print(json.dumps(cred))\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    return plugin


def _exec_user(
    plugin: Path, runs: Path, api: str = "client.authentication.k8s.io/v1"
) -> dict[str, Any]:
    env = [{"name": "RUNS", "value": str(runs)}]
    return {
        "exec": {
            "apiVersion": api,
            "command": str(plugin),
            "args": [],
            "env": env,
            "interactiveMode": "Never",
        }
    }


def test_an_exec_plugin_gives_the_token_and_runs_again_once_it_has_expired(tmp_path: Path) -> None:
    # client-go's exec authenticator: the plugin's status.token, cached until
    # status.expirationTimestamp
    runs = tmp_path / "runs"
    expired = _plugin(
        tmp_path, "{'token': 'from-plugin', 'expirationTimestamp': '2020-01-01T00:00:00Z'}"
    )
    cfg = parse_kubeconfig(str(kubeconfig(tmp_path / "kc", user=_exec_user(expired, runs))))
    assert cfg.exec_plugin is not None
    token = BearerToken(cfg)
    assert token.headers() == {"Authorization": "Bearer from-plugin"}
    assert token.token == "from-plugin"
    assert runs.read_text() == "2"  # expired: asked again each time
    lasting = _plugin(
        tmp_path, "{'token': 'lasting', 'expirationTimestamp': '2999-01-01T00:00:00Z'}"
    )
    token = BearerToken(
        parse_kubeconfig(str(kubeconfig(tmp_path / "kc2", user=_exec_user(lasting, runs))))
    )
    runs.unlink()
    assert token.token == "lasting"
    assert token.token == "lasting"
    assert runs.read_text() == "1"


async def test_the_client_runs_an_exec_plugin_off_the_event_loop_once_for_waiting_requests(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    plugin = _plugin(tmp_path, "{'token': 'slow', 'expirationTimestamp': '2999-01-01T00:00:00Z'}")
    text = plugin.read_text().replace("import json,", "import time; time.sleep(0.5)\nimport json,")
    plugin.write_text(text)
    token = BearerToken(
        parse_kubeconfig(str(kubeconfig(tmp_path / "kc", user=_exec_user(plugin, runs))))
    )
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(ticking())
    try:
        await asyncio.gather(token.refresh(), token.refresh(), token.refresh())
    finally:
        ticker.cancel()
    assert ticks >= 10  # the loop went on while the plugin slept half a second
    assert runs.read_text() == "1"
    assert token.headers() == {"Authorization": "Bearer slow"}
    assert runs.read_text() == "1"


@pytest.mark.parametrize(
    ("status", "api", "says"),
    [
        ("{}", "client.authentication.k8s.io/v1", "has no status.token"),
        ("{'clientCertificateData': 'x', 'clientKeyData': 'y'}", "client.authentication.k8s.io/v1",
         "client certificates from a plugin"),
        ("{'token': 't'}", "client.authentication.k8s.io/v1beta1", "not client.authentication"),
    ],
    ids=["no-token", "certificate", "wrong-version"],
)  # fmt: skip
def test_an_exec_plugin_that_cannot_be_used_names_the_field(
    tmp_path: Path, status: str, api: str, says: str
) -> None:
    runs = tmp_path / "runs"
    plugin = _plugin(tmp_path, status, api)
    cfg = parse_kubeconfig(str(kubeconfig(tmp_path / "kc", user=_exec_user(plugin, runs))))
    with pytest.raises(ConfigError) as caught:
        run_exec_plugin(cfg.exec_plugin)  # type: ignore[arg-type]
    assert caught.value.field == "users[u].user.exec"
    assert says in caught.value.message


def test_an_exec_plugin_that_fails_says_what_it_printed(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    plugin.write_text("#!/bin/sh\necho 'no credentials configured' >&2\nexit 3\n")
    plugin.chmod(0o755)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                     "installHint": "install the plugin"}}  # fmt: skip
    cfg = parse_kubeconfig(str(kubeconfig(tmp_path / "kc", user=user)))
    with pytest.raises(ConfigError) as caught:
        BearerToken(cfg).headers()
    assert "exited 3: no credentials configured" in caught.value.message
    assert "install the plugin" in caught.value.message


def test_the_yaml_is_parsed_in_a_child_and_pyyaml_never_loaded_here(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "kc")
    code = (
        "import sys\n"
        "from kubeclient.config import parse_kubeconfig\n"
        f"cfg = parse_kubeconfig({str(path)!r})\n"
        "print(cfg.server, cfg.token, 'yaml' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["https://api.test:6443", "t0k", "False"]


@pytest.mark.parametrize("child", ["answers", "cannot run"])
def test_a_file_that_is_not_yaml_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, child: str
) -> None:
    if child == "cannot run":
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    bad = tmp_path / "kc"
    bad.write_text("clusters: [unclosed\n")

    with pytest.raises(ConfigError) as caught:
        parse_kubeconfig(str(bad))

    assert str(caught.value).startswith(f"kubeconfig {bad}: not YAML: while parsing")


@pytest.mark.parametrize("child", ["declines", "cannot run"])
def test_what_json_cannot_carry_is_parsed_here_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, child: str
) -> None:
    # a date and an integer key: the child declines, the file is parsed in this process
    if child == "cannot run":
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    dated = tmp_path / "dated"
    text = kubeconfig(tmp_path / "kc").read_text() + "preferences: {1: x}\n"
    dated.write_text(text.replace("current-context: ctx", "current-context: 2020-01-01"))

    with (
        caplog.at_level(logging.DEBUG, "kubeclient.yamlchild"),
        pytest.raises(ConfigError) as caught,
    ):
        parse_kubeconfig(str(dated))

    # PyYAML's date is no context name: as when the file was always parsed here
    assert str(caught.value) == f"kubeconfig {dated}: current-context: not set"
    said = "the YAML child exited 3" if child == "declines" else "no child to parse YAML"
    assert said in caplog.text
