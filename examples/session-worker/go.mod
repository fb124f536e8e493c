module example.com/session-worker

go 1.22
