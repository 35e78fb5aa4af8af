#!/bin/bash
# local-slurm-setup.sh -- a single-host SLURM "cluster" for the tests in tests/slurm (and for
# trying the job templates in jobs/ on a laptop or a CI runner). Run as root; about 30 s from
# scratch on Debian 12 (slurm-wlm 22.05 + munge), no systemd, no cgroups, no accounting DB.
#
# Starts munged, one slurmctld and NNODES slurmd daemons: virtual nodes n1..nN, all on this host
# (Debian's slurmd is built with --enable-multiple-slurmd, so `slurmd -N nX` works). Stop them
# with jobs/local-slurm-stop.sh (by pid file, never by name).
#
# Env knobs:
#   NNODES=4          number of virtual nodes (each its own slurmd on port 17001..)
#   CPUS_PER_NODE=2   CPUs advertised per virtual node (may exceed the real cores: config_overrides)
#   CRED_EXPIRE=10    seconds; a requeued job is held for CRED_EXPIRE+1 s before it may start
#                     again (Slurm's default is 120 s, far too long for tests)
#   SKIP_MANDB=1      turn off man-db's index rebuild trigger (saves ~15 s of apt-get install)
#   WITH_PMIX=0       1: also install libpmix-dev so `srun --mpi=pmix` loads (the PyPI mpich
#                     wheel has no PMIx client; it uses pmi2, the default here)
#
# The jobs run as root with the project's virtual environment (.venv, made by ./run.sh): they
# get its python and mpiexec by path (the tests pass them with sbatch --export).
#
# Adapted from a recipe seen working with: sbatch, srun inside allocations,
# --signal=B:USR1@30, scancel --signal=USR1 --batch, scontrol requeue (SLURM_RESTART_COUNT),
# and mpiexec / srun --mpi=pmi2 with the PyPI mpich wheel. Caveats: the warning signal of
# --signal arrives up to 30 s late (slurmctld checks every 30 s); no accounting (no sacct):
# read `scontrol show job` (kept MinJobAge=300 s) or /var/log/slurm/jobcomp.log.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "local-slurm-setup.sh: must run as root" >&2; exit 1; }

NNODES=${NNODES:-4}
CPUS_PER_NODE=${CPUS_PER_NODE:-2}
WITH_PMIX=${WITH_PMIX:-0}
SKIP_MANDB=${SKIP_MANDB:-1}
CRED_EXPIRE=${CRED_EXPIRE:-10}
HOST=$(hostname -s)
T0=$(date +%s.%N)
ts() { awk -v a="$T0" -v b="$(date +%s.%N)" -v m="$*" 'BEGIN{printf "[slurm-setup +%6.1fs] %s\n", b-a, m}'; }

export DEBIAN_FRONTEND=noninteractive
# No init system: make sure package postinst scripts do not try to start the services.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
fi

# ---------------------------------------------------------------- packages
PKGS="slurmctld slurmd slurm-client munge"
[ "$WITH_PMIX" = 1 ] && PKGS="$PKGS libpmix-dev"
if ! { command -v slurmctld && command -v slurmd && command -v sinfo && command -v munged; } >/dev/null 2>&1 \
   || [ "$WITH_PMIX" = 1 ]; then
  if [ "$SKIP_MANDB" = 1 ]; then
    echo "man-db man-db/auto-update boolean false" | debconf-set-selections 2>/dev/null || true
  fi
  ts "apt-get update"
  apt-get update -qq
  # mpi_pmix_v4.so dlopen()s .../pmix2/lib/libpmix.so (unversioned, only in libpmix-dev)
  ts "apt-get install $PKGS"
  apt-get install -y -qq --no-install-recommends ${APT_EXTRA:-} $PKGS >/dev/null
else
  ts "packages already installed"
fi
PATH=/usr/sbin:/usr/bin:$PATH

# ---------------------------------------------------------------- hostname
getent hosts "$HOST" >/dev/null || echo "127.0.0.1 $HOST" >> /etc/hosts

# ---------------------------------------------------------------- munge
ts "start munged"
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge; chmod 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
fi
for i in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
munge -n | unmunge >/dev/null

# ---------------------------------------------------------------- stop a previous run (by pid file)
for f in /run/slurmd-n*.pid /run/slurmctld.pid; do
  [ -s "$f" ] || continue
  p=$(cat "$f"); kill "$p" 2>/dev/null || true
  for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  rm -f "$f"
done

# ---------------------------------------------------------------- slurm.conf
ts "write /etc/slurm/slurm.conf"
mkdir -p /etc/slurm /var/log/slurm
rm -rf /var/spool/slurmctld; mkdir -p /var/spool/slurmctld
LASTPORT=$((17000 + NNODES))
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ci
SlurmctldHost=${HOST}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=${CRED_EXPIRE}
SlurmctldPort=6817
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
# per-node TmpFS: with one shared /tmp the virtual nodes collide (srun --mpi=pmix app dirs)
TmpFS=/tmp/slurm-tmpfs/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
MailProg=/bin/true
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups / no systemd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# final job states survive MinJobAge here (no sacct without slurmdbd)
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5
MpiDefault=pmi2
ReturnToService=2
SlurmdParameters=config_overrides
DependencyParameters=kill_invalid_depend
JobRequeue=1
KillWait=5
MinJobAge=300
InactiveLimit=0
Waittime=0
NodeName=n[1-${NNODES}] NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=[17001-${LASTPORT}] CPUs=${CPUS_PER_NODE} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

# ---------------------------------------------------------------- daemons
ts "start slurmctld"
/usr/sbin/slurmctld
for i in $(seq 1 "$NNODES"); do
  mkdir -p /var/spool/slurmd/n$i /tmp/slurm-tmpfs/n$i; chmod 1777 /tmp/slurm-tmpfs/n$i
  /usr/sbin/slurmd -N n$i
done
ts "started $NNODES slurmd; waiting for the nodes to become idle"
for i in $(seq 120); do
  idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | wc -l)
  [ "$idle" -ge "$NNODES" ] && break
  sleep 0.5
done
sinfo
[ "$(sinfo -h -N -t idle -o %N | wc -l)" -ge "$NNODES" ] \
  || { echo "local-slurm-setup.sh: nodes not idle" >&2; tail -30 /var/log/slurm/slurmctld.log >&2; exit 1; }
ts "SLURM ready ($NNODES nodes x $CPUS_PER_NODE CPUs; stop with jobs/local-slurm-stop.sh)"
