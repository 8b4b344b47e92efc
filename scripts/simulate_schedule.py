#!/usr/bin/python3
"""The MPI runner's schedule (experiments/parallel/mpi_runner.hpp) simulated on unit costs:
rank 0 coordinates, ranks 1..N-1 take the next unit, largest estimated cost first, whenever
they finish one. Prints the makespan and the efficiency against the ideal (total work / N).

usage: simulate_schedule.py --cost T=SECONDS [--cost T=SECONDS ...] --layers L --groups G
                            --lengths T1,T2,... [--ranks 2,4,...,1024] [--latency 1e-4]
Costs of lengths not measured are extrapolated as a power law c * T^p through the two largest
measured lengths (p = 1 for sampled queries, 2 for every query)."""
import math
import argparse
import heapq


def unit_costs(measured, lengths, layers, groups):
    top, below = sorted(measured)[-1], sorted(measured)[-2]
    power = math.log(measured[top] / measured[below]) / math.log(top / below)
    print(f"cost per unit ~ T^{power:.2f} beyond T={top}")
    costs = []
    for t in lengths:
        c = measured.get(t, measured[top] * (t / top) ** power)
        costs += [c] * (layers * groups)
    return costs


def makespan(costs, workers, latency):
    # Largest first (ties keep list order, as std::stable_sort); each worker pays one message
    # round trip per unit.
    order = sorted(costs, reverse=True)
    free = [0.0] * workers
    heapq.heapify(free)
    for c in order:
        heapq.heappush(free, heapq.heappop(free) + c + latency)
    return max(free)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cost", action="append", required=True, help="T=seconds per unit")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--groups", type=int, required=True)
    p.add_argument("--lengths", required=True)
    p.add_argument("--ranks", default="2,4,8,16,32,64,128,256,512,1024")
    p.add_argument("--latency", type=float, default=1e-4, help="seconds per unit hand-out")
    a = p.parse_args()
    measured = {int(k): float(v) for k, v in (c.split("=") for c in a.cost)}
    lengths = [int(t) for t in a.lengths.split(",")]
    costs = unit_costs(measured, lengths, a.layers, a.groups)
    total = sum(costs)
    print(f"{len(costs)} units, total {total:.1f} s of work, largest unit {max(costs):.2f} s")
    print(f"{'ranks':>6} {'makespan s':>12} {'ideal s':>10} {'efficiency':>11}")
    for n in (int(r) for r in a.ranks.split(",")):
        m = makespan(costs, max(1, n - 1), a.latency) if n > 1 else total
        ideal = total / n
        print(f"{n:>6} {m:>12.1f} {ideal:>10.1f} {100 * ideal / m:>10.1f}%")


if __name__ == "__main__":
    main()
