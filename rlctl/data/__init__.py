"""Experience storage: the prioritized replay buffer (sum tree), its snapshot format, the frame store for stacked
image observations. numpy only; imported by replay shards, learners' data paths and tests."""
