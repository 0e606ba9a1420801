"""The seccomp filter of the code sandbox: system calls a scored program never needs, refused by the kernel.

`bwrap --seccomp FD` loads this classic-BPF program into the sandboxed process just before it
executes the interpreter; it stays in force for everything that process runs. It is a second
kernel layer behind the namespaces, for what namespaces and rlimits do not cover:

- new processes (`fork`, `vfork`, `clone` without `CLONE_THREAD`), when the limits allow only one;
  and every `clone`, threads too, when nothing else can bound the number of tasks
  (`allow_threads=False`: the trainer is root, which RLIMIT_NPROC exempts, and no pids cgroup);
- clearing the parent-death signal (`prctl(PR_SET_PDEATHSIG, ...)`): bwrap's `--die-with-parent`
  sets it so that the program dies with the trainer, and a program that could clear it would
  outlive it;
- making itself dumpable again (`prctl(PR_SET_DUMPABLE, non-zero)`; setting 0 is allowed):
  `sandbox_child.py` turns dumping off, because where `kernel.core_pattern` pipes core dumps to a
  host helper (systemd-coredump, apport) the kernel starts that helper as root for a crashing
  program whatever its RLIMIT_CORE, and hands it the program's memory;
- memory that RLIMIT_AS does not count: SysV shared memory, semaphores and message queues
  (`shm*`, `sem*`, `msg*`), POSIX message queues (`mq_*`), `memfd_create` and `memfd_secret`
  (POSIX shared memory is files in /dev/shm, a size-limited tmpfs);
- sockets of any family but AF_UNIX (`socket`, `socketpair`: EAFNOSUPPORT). The network
  namespace has no route out, but not every family is namespaced: AF_VSOCK reaches the host and
  the hypervisor of a virtual machine;
- new namespaces (`unshare`, `setns`, `clone` with a `CLONE_NEW*` flag): a nested user namespace
  would hand the program capabilities over whatever it creates inside it;
- `clone3`, whose flags live in memory a filter cannot read: it answers ENOSYS, and the C library
  falls back to `clone`, which the filter can check;
- the kernel keyrings (`keyctl`, `add_key`, `request_key`), which are not namespaced: the program
  would share the trainer's session keyring;
- the kernel log (`syslog`, readable by anyone where `kernel.dmesg_restrict` is 0);
- file leases and `flock` (`fcntl(F_SETLEASE)`, `flock`): on a host file it can only read (the
  standard library, a root-owned file when the trainer is root), a lease or lock would block a
  host writer until the call's timeout. POSIX record locks (`fcntl(F_SETLK)`) stay: sqlite needs them;
- interfaces that only widen the kernel's attack surface: `ptrace`, `process_vm_readv/writev`,
  `bpf`, `perf_event_open`, `userfaultfd`, `io_uring_*` (whose operations bypass seccomp), the
  mount calls, module and kexec loading.

Refused calls fail with EPERM (EAFNOSUPPORT for sockets; the program sees an OSError); they do not
kill it. A call through another ABI (32-bit x86 or x32 on x86-64) kills the process: its numbers
differ, so the checks above would not apply. Only x86-64 and aarch64 are described; elsewhere
`seccomp_program` returns None and the sandbox runs without a filter (`oxrl doctor` says so).
Arguments are compared in their low 32 bits, which is all the kernel reads of a socket family,
a prctl option or legacy `clone` flags.
"""

from __future__ import annotations

import errno
import platform
import socket
import struct
from dataclasses import dataclass

# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS: accumulator = 32-bit word at offset k of struct seccomp_data
JUMP_IF_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JUMP_IF_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JUMP_IF_ANY_BIT = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RETURN = 0x06  # BPF_RET | BPF_K
KILL_PROCESS, ALLOW, ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
# Offsets in struct seccomp_data: the syscall number, the audit arch, the low 32 bits of the first
# argument (both architectures are little-endian).
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET, ARG1_OFFSET = 0, 4, 16, 24
CLONE_THREAD = 0x00010000
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
CLONE_NEW_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
F_SETLEASE = 1024  # linux/fcntl.h: F_LINUX_SPECIFIC_BASE + 0
X32_SYSCALL_BIT = 0x40000000

ALWAYS_REFUSED = (
    "unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsmount", "fspick", "mount_setattr",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr", "memfd_create", "memfd_secret", "syslog", "flock",
)
PROCESS_CALLS = ("fork", "vfork")  # refused when only one process is allowed (aarch64 has neither)


@dataclass(frozen=True)
class Arch:
    audit_arch: int  # AUDIT_ARCH_* (linux/audit.h), what seccomp_data.arch holds
    syscalls: dict[str, int]
    has_x32: bool = False  # x32 calls arrive with this arch and X32_SYSCALL_BIT set in the number


# Numbers from asm/unistd_64.h (x86-64) and asm-generic/unistd.h (aarch64).
ARCHES = {
    "x86_64": Arch(0xC000003E, {
        "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "unshare": 272, "setns": 308, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semtimedop": 220,
        "semctl": 66, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "mq_open": 240, "mq_unlink": 241,
        "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
        "memfd_create": 319, "memfd_secret": 447, "socket": 41, "socketpair": 53, "prctl": 157, "syslog": 103,
        "flock": 73, "fcntl": 72,
    }, has_x32=True),
    "aarch64": Arch(0xC00000B7, {
        "clone": 220, "clone3": 435, "unshare": 97, "setns": 268, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "mount": 40, "umount2": 39, "pivot_root": 41, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semtimedop": 192,
        "semctl": 191, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "mq_open": 180, "mq_unlink": 181,
        "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185,
        "memfd_create": 279, "memfd_secret": 447, "socket": 198, "socketpair": 199, "prctl": 167, "syslog": 116,
        "flock": 32, "fcntl": 25,
    }),
}


def seccomp_program(allow_new_processes: bool, allow_threads: bool = True, machine: str | None = None) -> bytes | None:
    """The filter as the raw `struct sock_filter` array bwrap reads, or None on an undescribed architecture.

    `allow_threads=False` refuses every `clone`, threads included (and so new processes too).
    """
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    refuse = ERRNO | errno.EPERM
    code = [
        (LOAD_WORD, 0, 0, ARCH_OFFSET),
        (JUMP_IF_EQUAL, 1, 0, arch.audit_arch),  # our ABI: skip the kill
        (RETURN, 0, 0, KILL_PROCESS),
        (LOAD_WORD, 0, 0, NR_OFFSET),
    ]
    if arch.has_x32:
        code += [(JUMP_IF_AT_LEAST, 0, 1, X32_SYSCALL_BIT), (RETURN, 0, 0, KILL_PROCESS)]
    refused = [*ALWAYS_REFUSED, *(() if allow_new_processes else PROCESS_CALLS), *(() if allow_threads else ("clone",))]
    for name in refused:
        if name in arch.syscalls:
            code += [(JUMP_IF_EQUAL, 0, 1, arch.syscalls[name]), (RETURN, 0, 0, refuse)]
    code += [(JUMP_IF_EQUAL, 0, 1, arch.syscalls["clone3"]), (RETURN, 0, 0, ERRNO | errno.ENOSYS)]
    # Calls judged by an argument (the first, unless the block loads another). Each block ends by allowing
    # the call, so the accumulator, which then holds an argument, is never compared with the syscall
    # numbers that follow.
    only_unix = [(JUMP_IF_EQUAL, 1, 0, socket.AF_UNIX), (RETURN, 0, 0, ERRNO | errno.EAFNOSUPPORT)]
    blocks = {
        "socket": only_unix,
        "socketpair": only_unix,
        "prctl": [
            (JUMP_IF_EQUAL, 0, 1, PR_SET_PDEATHSIG), (RETURN, 0, 0, refuse),
            (JUMP_IF_EQUAL, 0, 3, PR_SET_DUMPABLE),  # not it: on to the block's allow
            (LOAD_WORD, 0, 0, ARG1_OFFSET), (JUMP_IF_EQUAL, 1, 0, 0), (RETURN, 0, 0, refuse),
        ],
        "fcntl": [(LOAD_WORD, 0, 0, ARG1_OFFSET), (JUMP_IF_EQUAL, 0, 1, F_SETLEASE), (RETURN, 0, 0, refuse)],
    }
    if allow_threads:  # otherwise refused above
        # clone: never new namespaces; a new process only when allowed (a thread always).
        blocks["clone"] = [
            (JUMP_IF_ANY_BIT, 0, 1, CLONE_NEW_NAMESPACES), (RETURN, 0, 0, refuse),
            *([] if allow_new_processes else [(JUMP_IF_ANY_BIT, 1, 0, CLONE_THREAD), (RETURN, 0, 0, refuse)]),
        ]
    for name, checks in blocks.items():
        body = [(LOAD_WORD, 0, 0, ARG0_OFFSET), *checks, (RETURN, 0, 0, ALLOW)]
        code += [(JUMP_IF_EQUAL, 0, len(body), arch.syscalls[name]), *body]
    code.append((RETURN, 0, 0, ALLOW))
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in code)
