"""A2C: synchronous advantage actor-critic (Mnih et al. 2016, synchronous as in OpenAI Baselines and SB3) on the
rollouts data path: every collector sends one rollout per version, one gradient step on n-step/GAE advantages."""
