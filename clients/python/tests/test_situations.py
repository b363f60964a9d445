"""The four situations of DESIGN section 1, written as SDK code."""

import os

import pytest


def test_1_csv_to_pandas_to_png(client, tmp_path):
    csv = "month,amount\n" + "".join(f"2026-{m:02}-01,{100 + m}\n" for m in range(1, 13)) + "2026-12-01,\n"
    code = """
import pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.read_csv("sales.csv", parse_dates=["month"]).dropna()
df.groupby("month")["amount"].sum().plot()
plt.savefig("/output/trend.png")
print(len(df))
"""
    execution = client.run(code, files={"sales.csv": csv.encode()})
    assert execution.status == "succeeded", execution.stderr
    assert execution.stdout == "12\n"
    png = execution.download("trend.png", dest=tmp_path / "trend.png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_2_a_test_suite_runs_with_no_outbound_network(client):
    suite = b"""
import socket, urllib.request
def test_math():
    assert 1 + 1 == 2
def test_no_way_out():
    try:
        urllib.request.urlopen("http://example.org/", timeout=5)
    except Exception:
        return
    raise AssertionError("reached the network")
"""
    runner = "import sys, pytest\nsys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'test_repo.py']))\n"
    execution = client.run(runner, files={"test_repo.py": suite})
    assert execution.status == "succeeded", execution.stdout + execution.stderr
    assert "2 passed" in execution.stdout


def test_3_an_infinite_loop_is_stopped_at_its_limit(client):
    execution = client.run("while True: pass", limits={"timeout_ms": 2000, "cpus": 0.5})
    assert execution.status == "timeout"


def test_4_a_read_only_dataset_and_a_writable_output(client):
    dataset = os.environ.get("SANDGATE_DATASET_FILE")
    if not dataset:
        pytest.fail("SANDGATE_DATASET_FILE is not set: run through `cargo test -p gateway --test e2e -- python_sdk::`")
    code = f"""
import shutil
rows = open('/data/census/{dataset}').read()
try:
    open('/data/census/{dataset}', 'a').write('tampered')
    print('modified')
except OSError as e:
    print('read-only', e.errno)
shutil.copy('/data/census/{dataset}', '/output/copy.csv')
"""
    execution = client.run(code, mounts=["dataset:census"])
    assert execution.status == "succeeded", execution.stderr
    assert execution.stdout.startswith("read-only")
    assert execution.download("copy.csv") == b"region,people\nnorth,12\n"
