"""Sales per region: reads sales.csv (uploaded into /workspace, the working directory), prints
a table and writes it to /output/summary.csv, which `sandgate exec --output-dir` downloads."""

import csv
from collections import defaultdict

totals = defaultdict(float)
units = defaultdict(int)
with open("sales.csv", newline="") as source:
    for row in csv.DictReader(source):
        totals[row["region"]] += float(row["amount"])
        units[row["region"]] += int(row["units"])

with open("/output/summary.csv", "w", newline="") as target:
    writer = csv.writer(target)
    writer.writerow(["region", "units", "amount"])
    for region in sorted(totals):
        writer.writerow([region, units[region], f"{totals[region]:.2f}"])
        print(f"{region:<6} {units[region]:>4} units {totals[region]:>10.2f}")

print(f"total  {sum(units.values()):>4} units {sum(totals.values()):>10.2f}")
