"""The critical path of a simulation of rank orders: which steps and transfers make its length.

rank_simulate.simulate_ranks times every step as the latest of three events: the rank's previous
step ends, the step's input arrives (a forward's activation, a backward's gradient), and, for a
transfer, the previous transfer over the same directed link ends (a link sends one at a time, in its
sender's order). Those precedences do not depend on the costs: the orders fix them. So the iteration
is the longest path through them, and any path priced at any other costs is a lower bound on the
simulation at those costs (a max-plus system is monotone in every duration). The planner's bound
over a shape's cuts (planner/path_bound.py) takes the path that is longest at one cut as a term for
every other cut.

critical_path walks the orders as simulate_ranks does (compute and transfers, not the all-reduces
after them) and keeps, for every step and transfer, the event its start waited for."""

from __future__ import annotations

from collections.abc import Sequence

from .ranks import RankSchedule

SEND = 4  # the column counting a boundary's transfers (after the step codes F, B, I, W)


def critical_path(
    schedule: RankSchedule,
    step_s: Sequence[Sequence[float]],
    send_s: Sequence[float],
) -> tuple[float, dict[tuple[int, int], int]]:
    """(the simulation's length, its longest path as counts {(stage, column): n}). `step_s[code][s]`:
    stage s's step of kind code (actions.CODE_OF: F, B, I, W) as charged; `send_s[s]`: a transfer
    across the boundary after stage s, either way (an activation s -> s + 1 or a gradient back): the
    column SEND of stage s counts it. Raises ValueError where the orders deadlock."""
    S, M, R = schedule.num_stages, schedule.num_micro_batches, schedule.num_ranks
    forward, backward, input_, weight = step_s
    where = schedule.route_table
    codes = schedule.encoded_orders
    last = S - 1
    # every event: its stage and column (as stage * 5 + column) and the event its start waited for
    # (-1: none)
    column: list[int] = []
    before: list[int] = []
    note, cause_of = column.append, before.append
    # [stage][micro-batch] -> (when the input is on its rank, the event that put it there)
    activation = [[-1.0] * M for _ in range(S)]
    activation[0] = [0.0] * M
    arrived = [[-1] * M for _ in range(S)]
    gradient = [[-1.0] * M for _ in range(S)]
    gradient_by = [[-1] * M for _ in range(S)]
    link = [[0.0] * R for _ in range(R)]  # [from rank][to rank] -> when the link is next free
    link_by = [[-1] * R for _ in range(R)]  # and its last transfer's event
    runs = [(0, 0.0, -1) for _ in range(R)]  # per rank: steps done, clock, its last step's event
    pending = list(range(R - 1, -1, -1))
    while pending:
        r = pending.pop()
        k, t, prev = runs[r]
        order = codes[r]
        n = len(order)
        links, links_by = link[r], link_by[r]
        woken = set()
        while k < n:
            code, s, m = order[k]
            cause = prev
            if code == 0:
                ready = activation[s][m]
                if ready < 0:
                    break
                if ready > t:
                    t, cause = ready, arrived[s][m]
                t += forward[s]
            elif code == 3:
                t += weight[s]
            else:
                if s < last:
                    ready = gradient[s][m]
                    if ready < 0:
                        break
                    if ready > t:
                        t, cause = ready, gradient_by[s][m]
                t += backward[s] if code == 1 else input_[s]
            prev = len(column)
            note(5 * s + code)
            cause_of(cause)
            if (code == 0 and s < last) or (s > 0 and code in (1, 2)):  # a hand-off or a transfer
                nxt, boundary = (s + 1, s) if code == 0 else (s - 1, s - 1)
                to = where[nxt][m]
                end, by = t, prev
                if to != r:  # a transfer: after the step, and after the link's last one
                    free = links[to]
                    if free > t:
                        end, by = free, links_by[to]
                    note(5 * boundary + SEND)
                    cause_of(by)
                    end, by = end + send_s[boundary], prev + 1
                    links[to], links_by[to] = end, by
                    woken.add(to)
                if code == 0:
                    activation[nxt][m], arrived[nxt][m] = end, by
                else:
                    gradient[nxt][m], gradient_by[nxt][m] = end, by
            k += 1
        runs[r] = (k, t, prev)
        pending.extend(woken)
    if any(run[0] < len(order) for run, order in zip(runs, codes)):
        raise ValueError(f"schedule {schedule.name!r} deadlocks")
    _, length, event = max(runs, key=lambda run: run[1])
    counts: dict[tuple[int, int], int] = {}
    while event >= 0:
        key = divmod(column[event], 5)
        counts[key] = counts.get(key, 0) + 1
        event = before[event]
    return length, counts
