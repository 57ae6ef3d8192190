"""Load: one server process, 8 writer and 8 sampler processes over gRPC on loopback for RL_DATA_LOAD_SECONDS
(default 60 s) against a `SampleToInsertRatio` table and a prioritized table.

No process may fail or hang, every sample must be an intact item of some writer, and after a graceful stop
(writers flush their last episode; samplers stop asking and drain what they asked for) the server's counters
reconcile exactly with what the clients report:
  - inserts (rate_limiter_info.insert_stats) == items the writers had confirmed, per table;
  - samples (rate_limiter_info.sample_stats) == samples the samplers received, per table (samplers only stop
    between requests, and the 'ratio' samplers end on a rate-limiter timeout, which samples nothing, so no
    sample is taken by the server and left undelivered);
  - current_size == inserts - deletes the samplers made ('ratio' has no deletes; nothing is evicted: the
    tables are larger than what is written);
  - num_unique_samples == distinct keys the samplers received;
  - episodes: 'ratio' holds every writer episode; for 'prio' live + fully deleted episodes == written ones.
Throughput and latency percentiles (writer `end_episode` flushes, per-sample waits) go to
benchmarks/results/load.json and are printed.
"""
import json
import os
import time

import pytest

from proc_testlib import Proc, ROOT, remote_client, rss_kb

DURATION_S = float(os.environ.get("RL_DATA_LOAD_SECONDS", "60"))
NUM_WRITERS = 8
# Comma-separated modes (see `_replay_procs.load_sampler`) may replace the default mix, e.g. to bisect a failure.
SAMPLER_MODES = (os.environ.get("RL_DATA_LOAD_SAMPLERS", "").split(",") if os.environ.get("RL_DATA_LOAD_SAMPLERS")
                 else ["ratio_dataset"] * 4 + ["prio_client"] * 2 + ["prio_dataset"] * 2)


@pytest.mark.slow
def test_load_reconciles_exactly(tmp_path):
    logs = str(tmp_path)
    procs = []
    server = Proc("serve", {"tables": "load"}, logs, "server")
    procs.append(server)
    try:
        port = int(server.expect("READY", 120))
        address = f"localhost:{port}"
        writers = [Proc("load_writer", {"index": i, "address": address}, logs, f"writer{i}")
                   for i in range(NUM_WRITERS)]
        prio_index = iter(range(len(SAMPLER_MODES)))
        samplers = []
        for i, mode in enumerate(SAMPLER_MODES):
            # 'prio' samplers own the keys with key % 4 == their index (only the owner deletes a key).
            index = next(prio_index) if mode != "ratio_dataset" else 100 + i
            samplers.append(Proc("load_sampler", {"index": index, "mode": mode, "address": address,
                                                  "num_samplers": 4}, logs, f"sampler{i}-{mode}"))
        procs += writers + samplers
        workers = writers + samplers
        for p in workers:  # start-up (TF import: seconds of CPU each) stays outside the measured window
            p.expect("READY", 300)
        rss_start = rss_kb(server.pid)
        for p in workers:
            p.send("GO")
        started = time.monotonic()
        while time.monotonic() - started < DURATION_S:
            for p in procs:
                assert p.alive(), f"{p.name} died during the load\n{p.stderr_tail()}"
            time.sleep(0.5)
        rss_peak = rss_kb(server.pid)
        # Everything written stays in the (unbounded) tables: a few hundred MB at most, never GiBs.
        assert rss_peak - rss_start < 2 << 20, f"server RSS grew from {rss_start} kB to {rss_peak} kB"
        for p in writers:
            p.send("STOP")
        stopping = time.monotonic()
        writer_reports = [p.report(120) for p in writers]
        writers_done = time.monotonic()
        for p in samplers:
            p.send("STOP")
        sampler_reports = [p.report(120) for p in samplers]
        samplers_done = time.monotonic()
        for p in workers:
            assert p.wait(60) == 0, f"{p.name} failed\n{p.stderr_tail()}"

        info = remote_client(address).server_info()
        by_table = {"ratio": [r for r in sampler_reports if r["table"] == "ratio"],
                    "prio": [r for r in sampler_reports if r["table"] == "prio"]}
        for table in ("ratio", "prio"):
            t = info[table]
            inserted = sum(r["items"][table] for r in writer_reports)
            sampled = sum(r["samples"] for r in by_table[table])
            deleted = [k for r in by_table[table] for k in r["deleted"]]
            assert len(set(deleted)) == len(deleted)
            unique = set().union(*(r["unique_keys"] for r in by_table[table]))
            episodes = sum(r["episodes"][table] for r in writer_reports)
            assert inserted > 0 and sampled > 0, (table, inserted, sampled)
            assert t.rate_limiter_info.insert_stats.completed == inserted, table
            by_mode = {m: sum(r["samples"] for r in by_table[table] if r["mode"] == m)
                       for m in sorted({r["mode"] for r in by_table[table]})}
            # More on the server than delivered = samples taken for a client that never received them (e.g. a
            # transport requesting past a dataset's max_samples, which loses queue items).
            assert t.rate_limiter_info.sample_stats.completed == sampled, (
                f"table {table}: the server took {t.rate_limiter_info.sample_stats.completed} samples, the "
                f"samplers received {sampled} ({by_mode})")
            assert t.current_size == inserted - len(deleted), table
            assert t.num_unique_samples == len(unique), table
            assert t.num_episodes + t.num_deleted_episodes == episodes, table
            if table == "ratio":
                assert not deleted and t.num_deleted_episodes == 0 and t.num_episodes == episodes
                # The limiter held: samples <= 2 * inserts - min_diff (0).
                assert sampled <= 2 * inserted
        server.send("STOP")
        assert server.wait(60) == 0, server.stderr_tail()
    finally:
        for p in procs:
            p.close()

    seconds = sum(r["seconds"] for r in writer_reports) / len(writer_reports)
    total_items = sum(sum(r["items"].values()) for r in writer_reports)
    total_samples = sum(r["samples"] for r in sampler_reports)

    def merged(key, reports):
        counts = [r[key]["count"] for r in reports]
        return {q: max(r[key][q] for r in reports if r[key]["count"]) for q in ("p50_ms", "p95_ms", "p99_ms")} | {
            "count": sum(counts), "aggregation": "max over processes"}

    result = {
        "suite": "load", "duration_s": DURATION_S, "writers": NUM_WRITERS, "samplers": SAMPLER_MODES,
        "cpu_count": os.cpu_count(),
        "items_inserted": {t: sum(r["items"][t] for r in writer_reports) for t in ("ratio", "prio")},
        "samples": {t: sum(r["samples"] for r in by_table[t]) for t in ("ratio", "prio")},
        "deletes": sum(len(r["deleted"]) for r in sampler_reports),
        "priority_updates": sum(r["updates"] for r in sampler_reports),
        "inserts_per_s": total_items / seconds, "samples_per_s": total_samples / seconds,
        "flush_latency_end_episode": merged("flush", writer_reports),
        "sample_wait_latency": {mode: merged("sample_wait", [r for r in sampler_reports if r["mode"] == mode])
                                for mode in sorted(set(SAMPLER_MODES))},
        "server_rss_mb": {"ready": rss_start / 1024, "end_of_load": rss_peak / 1024},
        "worker_rss_mb_max": max(r["rss_kb"] for r in writer_reports + sampler_reports) / 1024,
        "writers_flush_and_stop_s": writers_done - stopping,
        "samplers_drain_s": samplers_done - writers_done,
        "sampler_drain_s_by_mode": {mode: max(r["drain_s"] for r in sampler_reports if r["mode"] == mode)
                                    for mode in sorted(set(SAMPLER_MODES))},
    }
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results", "load.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
