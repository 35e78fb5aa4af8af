"""Throughput of the hpcckpt.codecs kernels against NumPy, zfec and ISA-L (via pyeclib).

    python benchmarks/bench_codecs.py [--quick] [--out FILE]   (default benchmarks/results/codecs.json)

GB/s = 1e9 bytes/s of *data input* (k x block bytes) per second, median of several
repetitions after one warm-up call (which also compiles the Numba kernels); buffers are filled
(pre-touched) before timing. Block sizes: 64 MiB and 512 MiB, 5 and 3 repetitions (--quick:
8 MiB, 2 repetitions). zfec and pyeclib (``pip install zfec pyeclib``; pyeclib's PyPI wheel
bundles liberasurecode and ISA-L) are optional: when missing, the JSON records why. Note that
pyeclib's encode takes the whole object as one bytes string and returns k + m fragments with
headers (its copies are part of what it costs a caller), while zfec and hpcckpt take the k
blocks separately.
"""
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numba  # noqa: E402
from common import ANCHOR_ISAL, ANCHOR_XOR_FUSED, ANCHOR_ZFEC, command, parser, say, write_json  # noqa: E402
from hpcckpt import codecs as C  # noqa: E402

MiB = 1 << 20


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def timeit(fn, reps):
    fn()                                   # warm-up (compiles, faults pages in)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts


def record(results, name, block, nbytes, ts, note=None):
    med = statistics.median(ts)
    entry = {"name": name, "block_bytes": block, "data_bytes": nbytes, "reps": len(ts),
             "median_s": med, "min_s": min(ts), "gbps_median": nbytes / med / 1e9,
             "gbps_best": nbytes / min(ts) / 1e9}
    if note:
        entry["note"] = note
    results.append(entry)
    print(f"  {name:<34s} {block // MiB:5d} MiB  {entry['gbps_median']:7.2f} GB/s "
          f"(best {entry['gbps_best']:.2f})", flush=True)


def skip(results, name, block, reason):
    results.append({"name": name, "block_bytes": block, "skipped": reason})
    print(f"  {name:<34s} {block // MiB:5d} MiB  skipped: {reason}", flush=True)


def bench_xor(results, block, reps, k=4):
    rng = np.random.default_rng(1)
    blocks = [rng.integers(0, 256, block, dtype=np.uint8) for _ in range(k)]
    out = np.zeros(block, dtype=np.uint8)
    record(results, f"xor k={k} numpy chained", block, k * block,
           timeit(lambda: C.xor_into_numpy(out, blocks), reps))
    ref = out.copy()
    record(results, f"xor k={k} hpcckpt fused", block, k * block,
           timeit(lambda: C.xor_into(out, blocks), reps))
    assert np.array_equal(out, ref)


def bench_rs(results, block, reps, k=4, m=2, numpy_ref=True):
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, (k, block), dtype=np.uint8)
    nbytes = k * block
    parity = C.rs_encode(data, m)
    record(results, f"rs {k}+{m} encode hpcckpt", block, nbytes,
           timeit(lambda: C.rs_encode(data, m), reps))
    record(results, f"rs {k}+{m} encode hpcckpt threads=2", block, nbytes,
           timeit(lambda: C.rs_encode(data, m, threads=2), reps))
    if numpy_ref:
        record(results, f"rs {k}+{m} encode numpy reference", block, nbytes,
               timeit(lambda: C.rs_encode_numpy(data, m), max(1, reps // 2)))
    survivors = {b: (data[b] if b < k else parity[b - k]) for b in range(2, k + m)}
    assert np.array_equal(C.rs_decode(survivors, k, m, block), data)
    record(results, f"rs {k}+{m} decode 2 lost hpcckpt", block, nbytes,
           timeit(lambda: C.rs_decode(survivors, k, m, block), reps))
    record(results, f"rs {k}+{m} decode 2 lost hpcckpt thr=2", block, nbytes,
           timeit(lambda: C.rs_decode(survivors, k, m, block, threads=2), reps))

    try:
        import zfec
    except ImportError as e:
        skip(results, f"rs {k}+{m} encode zfec", block, f"zfec not importable: {e}")
    else:
        enc = zfec.Encoder(k, k + m)
        ins = [memoryview(d) for d in data]
        record(results, f"rs {k}+{m} encode zfec", block, nbytes,
               timeit(lambda: enc.encode(ins, list(range(k, k + m))), reps))
        zpar = enc.encode(ins, list(range(k, k + m)))         # zfec's own parity
        # zfec wants a primary block i at list position i: parities fill the lost slots
        nums = list(range(k, k + m))[:2] + list(range(2, k))
        blks = [zpar[0], zpar[1]] + ins[2:]
        dec = zfec.Decoder(k, k + m)
        got = dec.decode(blks, nums)
        assert bytes(got[0]) == data[0].tobytes() and bytes(got[1]) == data[1].tobytes()
        record(results, f"rs {k}+{m} decode 2 lost zfec", block, nbytes,
               timeit(lambda: dec.decode(blks, nums), reps))
        del got, zpar

    if nbytes >= (1 << 31) - 4096:
        skip(results, f"rs {k}+{m} isa-l (pyeclib)", block,
             "pyeclib/liberasurecode fail on payloads >= 2 GiB (observed: 'ERROR in encode' "
             "then a segfault with 4 x 512 MiB)")
        return
    try:
        from pyeclib.ec_iface import ECDriver
        drv = ECDriver(k=k, m=m, ec_type="isa_l_rs_vand")
    except Exception as e:  # noqa: BLE001 (any failure means: not available here)
        skip(results, f"rs {k}+{m} encode isa-l (pyeclib)", block, f"{type(e).__name__}: {e}")
    else:
        try:
            payload = data.tobytes()
            frags = drv.encode(payload)
            record(results, f"rs {k}+{m} encode isa-l (pyeclib)", block, nbytes,
                   timeit(lambda: drv.encode(payload), reps),
                   note="pyeclib: one bytes object in, k+m fragments with headers out")
            keep = frags[2:]
            assert drv.decode(keep) == payload
            record(results, f"rs {k}+{m} decode 2 lost isa-l (pyeclib)", block, nbytes,
                   timeit(lambda: drv.decode(keep), reps))
            del frags, keep, payload
        except Exception as e:  # noqa: BLE001
            skip(results, f"rs {k}+{m} isa-l (pyeclib)", block, f"{type(e).__name__}: {e}")


def summarize(results):
    """The figures the targets are about: XOR vs the Numba-fused anchor, RS encode vs zfec and ISA-L."""
    by = {(r["name"], r["block_bytes"] // MiB): r.get("gbps_median") for r in results}
    out = {}
    for mib in sorted({b for _, b in by}):
        g = lambda n: by.get((n, mib))  # noqa: E731
        row = {"xor_fused_gbps": g("xor k=4 hpcckpt fused"), "xor_numpy_gbps": g("xor k=4 numpy chained"),
               "rs_encode_gbps": g("rs 4+2 encode hpcckpt"), "rs_encode_threads2_gbps": g("rs 4+2 encode hpcckpt threads=2"),
               "rs_encode_zfec_gbps": g("rs 4+2 encode zfec"), "rs_encode_isal_gbps": g("rs 4+2 encode isa-l (pyeclib)"),
               "rs_decode_gbps": g("rs 4+2 decode 2 lost hpcckpt"), "rs_decode_zfec_gbps": g("rs 4+2 decode 2 lost zfec"),
               "rs_decode_isal_gbps": g("rs 4+2 decode 2 lost isa-l (pyeclib)")}
        anchor = ANCHOR_XOR_FUSED.get(mib)
        if anchor and row["xor_fused_gbps"]:
            row["xor_fraction_of_anchor_fused"] = row["xor_fused_gbps"] / anchor
            row["anchor_xor_fused_gbps"] = anchor
        for other in ("zfec", "isal"):
            if row["rs_encode_gbps"] and row[f"rs_encode_{other}_gbps"]:
                row[f"rs_encode_x_{other}"] = row["rs_encode_gbps"] / row[f"rs_encode_{other}_gbps"]
        row["anchor_zfec_gbps"], row["anchor_isal_gbps"] = ANCHOR_ZFEC.get(mib), ANCHOR_ISAL.get(mib)
        out[str(mib)] = row
    return out


def main(argv=None):
    args = parser(__doc__, "8 MiB blocks only, 2 repetitions", hidden=()).parse_args(argv)

    sizes = [(8 * MiB, 2)] if args.quick else [(64 * MiB, 5), (512 * MiB, 3)]
    info = {
        "numba_threads": numba.get_num_threads(), "loadavg_start": os.getloadavg(),
        "command": command("bench_codecs.py", argv),
    }
    results = []
    say(f"codecs: {cpu_model()}, {os.cpu_count()} cpus, numpy {np.__version__}, numba {numba.__version__}")
    for block, reps in sizes:
        say(f"codecs: block {block // MiB} MiB, XOR k=4 and RS 4+2 (hpcckpt, NumPy, zfec, ISA-L)")
        bench_xor(results, block, reps)
        bench_rs(results, block, reps, numpy_ref=block <= 64 * MiB)
    info["loadavg_end"] = os.getloadavg()
    summary = summarize(results)
    for mib, row in summary.items():
        say(f"  {mib} MiB: xor {row['xor_fused_gbps']:.2f} GB/s"
            + (f" ({row['xor_fraction_of_anchor_fused']:.0%} of the fused anchor)" if "xor_fraction_of_anchor_fused" in row else "")
            + f"; rs encode {row['rs_encode_gbps']:.2f} GB/s"
            + "".join(f", {row[f'rs_encode_x_{o}']:.1f}x {o}" for o in ("zfec", "isal") if f"rs_encode_x_{o}" in row))
    path = write_json("codecs", {**info, "unit": "GB/s = 1e9 data-input bytes (k x block) per second",
                                 "summary": summary, "results": results}, args.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
