"""Ape-X DQN: double, dueling, n-step DQN over prioritized replay shards, with the Ape-X epsilon ladder."""
