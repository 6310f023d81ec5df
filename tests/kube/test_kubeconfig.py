"""Reading a kubeconfig or the in-cluster account as client-go does (clientcmd), refusing what
the client does not support with the field named."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

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
        ({"exec": {"command": "aws"}}, "users[u].user.exec", "exec credential plugins"),
        ({"auth-provider": {"name": "gcp"}}, "users[u].user.auth-provider", "auth-provider"),
        ({"username": "a"}, "users[u].user.username", "basic authentication"),
        ({"token": "t", "as": "someone"}, "users[u].user.as", "impersonation"),
        ({"tokne": "t"}, "users[u].user.tokne", "unknown field"),
        ({"client-certificate": "/c.crt"}, "users[u].user.client-key", "needs both"),
        ({"client-key-data": "!!"}, "users[u].user.client-key-data", "not base64"),
    ],
    ids=["exec", "auth-provider", "basic", "impersonation", "typo", "cert-no-key", "bad-base64"],
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
