"""Prints the comparison table from the JSON lines the runs wrote."""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
best = {}
for r in rows:
    if not r["peer"].startswith("wick"):
        o = r["output"]
        if r["images_per_sec"] > best.get(o, (0, ""))[0]:
            best[o] = (r["images_per_sec"], r["peer"])
print(f"| loader | output | images/s | vs best peer | peak RSS MB |")
print(f"|---|---|---|---|---|")
for r in sorted(rows, key=lambda r: (r["output"], -r["images_per_sec"])):
    b = best.get(r["output"], (0, ""))[0]
    ratio = f"{r['images_per_sec'] / b:.2f}x" if b else "-"
    print(f"| {r['peer']} | {r['output']} | {r['images_per_sec']:.0f} | {ratio} | {r['peak_rss_mb']} |")
for o, (v, name) in sorted(best.items()):
    print(f"best peer {o}: {name} {v:.0f} images/s")
decode = best.get("decode", (0, ""))[0]
if decode:
    for r in rows:
        if r["peer"].startswith("wick") and r["output"] == "u8":
            print(f"stretch: {r['peer']} u8 RRC at {r['images_per_sec'] / decode:.2f}x "
                  f"the decode-only rate of {best['decode'][1]}")
