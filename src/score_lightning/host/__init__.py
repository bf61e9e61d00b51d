"""What the machine offers this process now: the CPUs it may run on and how busy other work keeps them
(``cpu_load``), and the thread count that follows from it while a run goes on (``thread_control``). Below every
other package: it imports none of them, so the launch layer and the callbacks both read it."""
