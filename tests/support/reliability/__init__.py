"""The reliability scenarios: tests/reliability/ runs them scaled down, ``make soak`` at full
scale."""
