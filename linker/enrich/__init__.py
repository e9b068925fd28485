"""After linking, before converting: what the formats' linkers leave to others.

- sidecars.py, routing.py, kv.py: our collectors' sidecar files (MoE routing bins, KV-cache
  loads and stores) hung on the linked ops;
- engine_steps.py: vLLM's engine-step annotations as step ops;
- gaps.py: the slack between ops as gap ops (called by the output target, which knows how its
  reader replays).
"""
