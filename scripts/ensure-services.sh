#!/usr/bin/env bash
# Make sure the services the tests use for real are answering: PostgreSQL on 127.0.0.1:5432, Redis on 127.0.0.1:6379.
set -euo pipefail

wait_for() {  # wait_for NAME COMMAND...: up to 30 s
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then echo "$name is up"; return 0; fi
    sleep 0.5
  done
  echo "$name did not come up" >&2; return 1
}

if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start || true
fi
wait_for PostgreSQL pg_isready -h 127.0.0.1 -p 5432 -q

if ! redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
  echo "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi
wait_for Redis sh -c 'redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG'

# RabbitMQ: the celery executor's broker (guest/guest, loopback only). It can take a while to boot.
amqp_up() { timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5672'; }
if ! amqp_up 2>/dev/null; then
  echo "starting RabbitMQ"
  rabbitmq-server -detached || true
fi
wait_for RabbitMQ amqp_up || wait_for RabbitMQ amqp_up
