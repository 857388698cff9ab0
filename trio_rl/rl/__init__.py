"""RL data: rollouts, advantages and Datum assembly, the KL penalty, and metrics."""
