"""The lab's orchestration: starting the real parts (dev server, provider,
workers) as separate processes, and the demo that kills and resumes a run."""
