"""A simulated fleet's workloads and the oracle they are judged against.

`tokenfront simulate` runs a fleet of simulated GPU workers (docs/simulation.md); this package says what to send
them and what the best routing could reach:

- `requests`: `TimedRequest`, a request at a time whose prompt is token ids (sent as a `/v1/completions` id
  prompt, which a router and a simulated worker carry exactly; no text is rendered);
- `workloads`: agentic sessions (a shared system prompt and tools, turns of tool output and short answers,
  sessions arriving as a Poisson process) and groups of users sharing long documents;
- `mooncake`: the Mooncake trace format (JSONL of `timestamp`, `input_length`, `output_length`, `hash_ids`
  of 512-token blocks): read, write, replay, and traces generated from the workloads above;
- `oracle`: the achievable prefix-cache hit rate of a request sequence for a fleet's total cache blocks;
- `load`: the share of a fleet's prefill capacity a request sequence uses under round-robin, and the arrival
  rate scale that reaches a given one; `scenario`: the workload a run replays (named on the command line,
  cut at a duration, at a scaled rate);
- `replay`: the offline replay, the real engines, index and policy in one process on `virtual_clock`'s loop;
  `results`: what a policy's run measured and its summary.

The runner, `python -m benchmarks.fleet` (`__main__.py`: a `benchmarks/fleet.py` module would be hidden by this
package), sends a workload through `tokenfront route` to a `tokenfront simulate` fleet (or, `--offline`,
replays it on the virtual clock) for each policy, and compares what the workers report in
`usage.prompt_tokens_details.cached_tokens` with the oracle (docs/routing.md).
"""
