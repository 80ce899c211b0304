from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("baldur_django", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="BreakerRecord",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=80, unique=True)),
                ("name", models.TextField()),
                ("record", models.TextField(default="")),
                ("last_seen", models.FloatField(db_index=True, default=0.0)),
            ],
            options={"verbose_name": "shared breaker record", "default_permissions": ()},
        ),
        migrations.CreateModel(
            name="BreakerLock",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=120, unique=True)),
                ("token", models.CharField(max_length=64)),
                ("expires_at", models.FloatField()),
            ],
            options={"verbose_name": "fleet lock", "default_permissions": ()},
        ),
    ]
