from speculant.scheduler.scheduler import QueueFull, Scheduler

__all__ = ["QueueFull", "Scheduler"]
