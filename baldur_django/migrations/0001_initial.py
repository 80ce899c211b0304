"""Operator models: the table-less Breaker (admin list + force permission) and the audit.

Works on every supported Django (5.2 LTS, 6.0, 6.1)."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Breaker",
            fields=[
                (
                    "service",
                    models.CharField(max_length=255, primary_key=True, serialize=False, verbose_name="service"),
                ),
            ],
            options={
                "verbose_name": "circuit breaker",
                "verbose_name_plural": "circuit breakers",
                "permissions": [("force_circuit", "Can force circuit breakers open or closed")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="BreakerAudit",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("at", models.DateTimeField(db_index=True, default=django.utils.timezone.now, verbose_name="when")),
                ("actor", models.CharField(blank=True, default="", max_length=150, verbose_name="who")),
                (
                    "action",
                    models.CharField(
                        choices=[("open", "force open"), ("close", "force closed"), ("release", "release")],
                        max_length=16,
                        verbose_name="action",
                    ),
                ),
                ("service", models.TextField(verbose_name="service")),
                ("ttl_minutes", models.FloatField(blank=True, null=True, verbose_name="lifetime (minutes)")),
                ("expires_at", models.DateTimeField(blank=True, null=True, verbose_name="expires at")),
                ("reason", models.TextField(blank=True, default="", verbose_name="reason")),
                (
                    "source",
                    models.CharField(
                        choices=[("admin", "admin"), ("command", "management command"), ("api", "API")],
                        default="api",
                        max_length=16,
                        verbose_name="source",
                    ),
                ),
                ("from_state", models.CharField(blank=True, default="", max_length=16, verbose_name="state before")),
                ("to_state", models.CharField(blank=True, default="", max_length=16, verbose_name="state after")),
                ("dry_run", models.BooleanField(default=False, verbose_name="dry-run")),
            ],
            options={
                "verbose_name": "breaker audit entry",
                "verbose_name_plural": "breaker audit entries",
                "ordering": ("-at", "-id"),
                "default_permissions": ("view",),
            },
        ),
    ]
