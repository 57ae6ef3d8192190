"""`replay-tf serve`: table configs -> tables, and a real server process (gRPC, stats, Ctrl-C, checkpoints)."""
import json
import re
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

import proc_testlib
import replay_tf as reverb
from replay_tf import cli


def _info(table):
    info = table.info
    return (info.name, info.sampler_options, info.remover_options, info.max_size, info.max_times_sampled,
            info.rate_limiter_info, info.signature)


@pytest.mark.parametrize("entry, expected", [
    ({"name": "t", "sampler": "uniform", "remover": "fifo", "max_size": 10, "rate_limiter": {"min_size": 2}},
     reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(2))),
    ({"name": "p", "sampler": {"prioritized": {"priority_exponent": 0.8}}, "remover": "min_heap",
      "max_size": 5, "max_times_sampled": 3,
      "rate_limiter": {"sample_to_insert_ratio": {"samples_per_insert": 4.0, "min_size_to_sample": 10,
                                                  "error_buffer": 8.0}}},
     reverb.Table("p", reverb.selectors.Prioritized(0.8), reverb.selectors.MinHeap(), 5,
                  reverb.rate_limiters.SampleToInsertRatio(4.0, 10, 8.0), max_times_sampled=3)),
    ({"name": "h", "sampler": {"max_heap": None}, "remover": "lifo", "max_size": 7,
      "rate_limiter": {"min_size": {"min_size_to_sample": 1}}},
     reverb.Table("h", reverb.selectors.MaxHeap(), reverb.selectors.Lifo(), 7, reverb.rate_limiters.MinSize(1))),
    ({"name": "q", "queue": 4, "signature": {"obs": {"shape": [2, 3], "dtype": "float32"},
                                             "pair": [{"shape": [], "dtype": "int64"},
                                                      {"shape": [None], "dtype": "uint8"}]}},
     reverb.Table.queue("q", 4, signature={"obs": tf.TensorSpec([2, 3], tf.float32),
                                           "pair": (tf.TensorSpec([], tf.int64), tf.TensorSpec([None], tf.uint8))})),
    ({"name": "s", "stack": 3}, reverb.Table.stack("s", 3)),
])
def test_build_tables_matches_tables_built_with_the_api(entry, expected):
    [table] = cli.build_tables({"tables": [entry]})
    assert _info(table) == _info(expected)


@pytest.mark.parametrize("config, match", [
    ({}, "non-empty 'tables' list"),
    ({"tables": []}, "non-empty 'tables' list"),
    ({"tables": [{"name": "t", "queue": 3, "sampler": "fifo"}]}, re.escape("tables[0]: 'queue' sets the selectors")),
    ({"tables": [{"name": "t", "sampler": "fifo"}]}, re.escape("tables[0]: missing ['remover', 'max_size'")),
    ({"tables": [{"name": "t", "sampler": "best", "remover": "fifo", "max_size": 1, "rate_limiter": "min_size"}]},
     re.escape("tables[0].sampler: unknown 'best'; known: ['uniform', 'prioritized'")),
    ({"tables": [{"name": "t", "sampler": "fifo", "remover": "fifo", "max_size": 1,
                  "rate_limiter": {"queue": 0}}]}, re.escape("tables[0].rate_limiter.queue: size (0)")),
    ({"tables": [{"name": "t", "sampler": {"prioritized": {"alpha": 1}}, "remover": "fifo", "max_size": 1,
                  "rate_limiter": {"min_size": 1}}]}, re.escape("tables[0].sampler.prioritized:")),
    ({"tables": [{"name": "t", "queue": 2, "signature": {"x": {"shape": [2], "dtype": "float99"}}}]},
     re.escape("tables[0].signature.x: invalid tensor spec")),
    ({"tables": [{"name": "t", "queue": 2, "colour": "red"}]}, re.escape("tables[0]: unknown keys ['colour']")),
    ({"tables": [{"queue": 2}]}, re.escape("tables[0].name: a non-empty table name is required")),
])
def test_build_tables_errors_name_the_entry(config, match):
    with pytest.raises(cli.ConfigError, match=match):
        cli.build_tables(config)


def test_load_config_json_and_yaml(tmp_path):
    config = {"port": 1234, "tables": [{"name": "q", "queue": 3}]}
    (tmp_path / "c.json").write_text(json.dumps(config))
    assert cli.load_config(str(tmp_path / "c.json")) == config
    (tmp_path / "bad.json").write_text("{tables: ")
    with pytest.raises(cli.ConfigError, match="not valid JSON"):
        cli.load_config(str(tmp_path / "bad.json"))
    pytest.importorskip("yaml")
    (tmp_path / "c.yaml").write_text("port: 1234\ntables:\n  - name: q\n    queue: 3\n")
    assert cli.load_config(str(tmp_path / "c.yaml")) == config
    (tmp_path / "list.yaml").write_text("- name: q\n  queue: 3\n")  # a bare list of tables
    assert cli.load_config(str(tmp_path / "list.yaml")) == {"tables": [{"name": "q", "queue": 3}]}


def test_help_is_there_for_newcomers(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for text in ("--config", "--checkpoint-dir", "--host", "--port", "queue: 1000", "sample_to_insert_ratio",
                 "--tls-cert", "--tls-key", "--auth-token-file"):
        assert text in out


def test_bad_config_exits_2_with_the_reason(tmp_path, capsys):
    (tmp_path / "c.json").write_text(json.dumps({"tables": [{"name": "t", "queue": -1}]}))
    assert cli.main(["serve", "--config", str(tmp_path / "c.json")]) == 2
    assert "tables[0]" in capsys.readouterr().err


@pytest.mark.slow  # a server process
def test_serve_process_stats_ctrl_c_and_checkpoint_restore(tmp_path):
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": [
        {"name": "replay", "sampler": "uniform", "remover": "fifo", "max_size": 100, "rate_limiter": {"min_size": 1},
         "signature": {"x": {"shape": [1, 2], "dtype": "float32"}}},
        {"name": "q", "queue": 10}]}))
    port = proc_testlib.free_port()
    checkpoints = tmp_path / "checkpoints"
    args = ["--config", str(config), "--port", str(port), "--checkpoint-dir", str(checkpoints),
            "--stats-interval", "0.5"]
    server = proc_testlib.ServeProcess(*args)
    try:
        server.wait_for(rf"serving tables \['q', 'replay'\] on localhost:{port}")
        client = reverb.Client(f"localhost:{port}")  # no server of this process there: the gRPC transport
        info = client.server_info(timeout=30)
        assert sorted(info) == ["q", "replay"]
        assert info["replay"].signature == {"x": tf.TensorSpec([1, 2], tf.float32)}
        for i in range(3):
            client.insert({"x": np.float32([i, i])}, priorities={"replay": 1.0})
        sample = next(client.sample("replay", emit_timesteps=False))
        assert sample.data[0].shape == (1, 2)
        server.wait_for(r"table replay: size 3/100, inserts 3 \(.*\), samples 1 ")
        assert server.stop(signal.SIGINT) == 0
        server.wait_for(r"replay-tf: stopped", timeout_s=10)
        assert any(line.startswith("checkpoint: ") for line in server.seen)
    finally:
        server.kill()
    assert any(checkpoints.iterdir())

    restarted = proc_testlib.ServeProcess(*args)
    try:
        restarted.wait_for(r"restored from .*'replay': 3")
        assert reverb.Client(f"localhost:{port}").server_info(timeout=30)["replay"].current_size == 3
        assert restarted.stop(signal.SIGTERM) == 0
    finally:
        restarted.kill()


@pytest.mark.slow  # a server process
def test_serve_with_tls_and_a_token_file(tmp_path, monkeypatch):
    import grpc  # noqa: PLC0415
    from replay_tf import errors  # noqa: PLC0415

    # The certificate is made as in grpc/test_security.py (a conftest fixture would share it).
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out",
                    "cert.pem", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], cwd=tmp_path, check=True,
                   capture_output=True)
    (tmp_path / "token.txt").write_text("tok-from-file\n")
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": [{"name": "q", "queue": 10}]}))
    port = proc_testlib.free_port()
    server = proc_testlib.ServeProcess("--config", str(config), "--port", str(port), "--tls-cert", str(tmp_path / "cert.pem"),
                           "--tls-key", str(tmp_path / "key.pem"), "--auth-token-file", str(tmp_path / "token.txt"))
    try:
        server.wait_for(rf"serving tables \['q'\] on localhost:{port} with TLS and auth token")
        credentials = grpc.ssl_channel_credentials((tmp_path / "cert.pem").read_bytes())
        with pytest.raises(errors.ReverbError, match="UNAUTHENTICATED"):
            reverb.Client(f"localhost:{port}", channel_credentials=credentials).server_info(timeout=30)
        client = reverb.Client(f"localhost:{port}", channel_credentials=credentials, auth_token="tok-from-file")
        client.insert(np.float32(7), priorities={"q": 1.0})
        assert float(next(client.sample("q", emit_timesteps=False)).data[0][0]) == 7.0
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.kill()


@pytest.mark.parametrize("files,error", [
    ({"tls_cert": "cert.pem"}, r"--tls-cert and --tls-key go together"),
    ({"auth_token_file": "empty.txt"}, r"--auth-token-file \(.*empty.txt\) is empty"),
])
def test_bad_security_flags_exit_2(tmp_path, capsys, files, error):
    (tmp_path / "c.json").write_text(json.dumps({"tables": [{"name": "q", "queue": 3}]}))
    (tmp_path / "cert.pem").write_text("x")
    (tmp_path / "empty.txt").write_text("  \n")
    flags = [item for name, file in files.items() for item in (f"--{name.replace('_', '-')}", str(tmp_path / file))]
    assert cli.main(["serve", "--config", str(tmp_path / "c.json"), *flags]) == 2
    assert re.search(error, capsys.readouterr().err)
