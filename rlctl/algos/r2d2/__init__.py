"""R2D2: recurrent replay distributed DQN (Kapturowski et al. 2019): recurrent Q-network, targets, sequence cutting."""
