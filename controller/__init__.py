import os

# gRPC's fork handlers restart its poller in a forked child; when the child's close_fds has
# already closed gRPC's epoll fd, the child aborts before exec (grpc/grpc#43055, seen here as a
# switch or controller "exiting" with SIGABRT and "epoll_wait ... Bad file descriptor"). These
# processes fork tc, ip and switches while channels are open, and never use gRPC in a child:
# fork support off, before anything imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
