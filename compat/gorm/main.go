// Command gorm runs GORM (with its pgx driver) through fenceproxy: one real program per compatibility cell
// (compat/compat_test.go). It is its own module so that GORM is not a dependency of fenceproxy. Environment as
// compat/django/matrix.py. Prints "ok CELL" or "FAIL CELL: why"; exits 1 if any failed.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
)

// Mapped maps every column, the token column included.
type Mapped struct {
	ID         int64 `gorm:"primaryKey;autoIncrement:false"`
	Balance    int64
	Note       *string
	FenceToken *int64
}

// Legacy does not know the token column.
type Legacy struct {
	ID      int64 `gorm:"primaryKey;autoIncrement:false"`
	Balance int64
	Note    *string
}

var (
	table    = os.Getenv("TABLE")
	oldToken = mustInt(os.Getenv("OLD_TOKEN"))
	newToken = mustInt(os.Getenv("NEW_TOKEN"))
	failed   = 0
)

func mustInt(s string) int64 {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		panic(err)
	}
	return v
}

func open(options string) *gorm.DB {
	dsn := fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", os.Getenv("PGHOST"), os.Getenv("PGPORT"), os.Getenv("PGUSER"), os.Getenv("PGDATABASE"))
	if options != "" {
		dsn += " options='" + options + "'"
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	return db
}

type rowState struct {
	balance int64
	token   *int64
}

func main() {
	ctx := context.Background()
	direct, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", os.Getenv("PGHOST"), os.Getenv("DIRECT_PORT"), os.Getenv("PGUSER"), os.Getenv("PGDATABASE")))
	if err != nil {
		panic(err)
	}
	row := func(id int64) *rowState {
		var r rowState
		err := direct.QueryRow(ctx, "SELECT balance::int8, fence_token FROM "+table+" WHERE id = $1", id).Scan(&r.balance, &r.token)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			panic(err)
		}
		return &r
	}
	is := func(id, balance, token int64) error {
		r := row(id)
		if r == nil || r.balance != balance || r.token == nil || *r.token != token {
			return fmt.Errorf("row %d is %+v, want balance %d token %d", id, r, balance, token)
		}
		return nil
	}
	db := open("-c fence.token=" + strconv.FormatInt(oldToken, 10)).Table(table)
	fresh := open("").Table(table)
	tab := func(d *gorm.DB) *gorm.DB { return d.Session(&gorm.Session{NewDB: true}).Table(table) }
	seven, one := int64(7), int64(1)

	cell("create", func() error {
		if err := tab(db).Create(&Mapped{ID: 1, Balance: 10, FenceToken: &seven}).Error; err != nil {
			return err
		}
		return is(1, 10, oldToken)
	})
	cell("bulk_create", func() error {
		if err := tab(db).Create([]Mapped{{ID: 2, Balance: 20}, {ID: 3, Balance: 30, FenceToken: &one}}).Error; err != nil {
			return err
		}
		if err := tab(db).Create([]Legacy{{ID: 4, Balance: 40}, {ID: 5, Balance: 50}}).Error; err != nil {
			return err
		}
		for _, id := range []int64{2, 3, 4, 5} {
			if r := row(id); r == nil || r.token == nil || *r.token != oldToken {
				return fmt.Errorf("row %d is %+v", id, r)
			}
		}
		return nil
	})
	cell("partial_update", func() error {
		if err := tab(db).Where("id = ?", 2).Update("balance", 21).Error; err != nil {
			return err
		}
		return is(2, 21, oldToken)
	})
	cell("full_row_update", func() error {
		var m Mapped
		if err := tab(db).First(&m, 3).Error; err != nil {
			return err
		}
		m.Balance = 31
		if err := tab(db).Save(&m).Error; err != nil { // every column, the token's own value included
			return err
		}
		return is(3, 31, oldToken)
	})
	cell("upsert", func() error {
		rows := []Mapped{{ID: 3, Balance: 32, FenceToken: &one}, {ID: 6, Balance: 60, FenceToken: &one}}
		if err := tab(db).Clauses(clause.OnConflict{UpdateAll: true}).Create(&rows).Error; err != nil {
			return err
		}
		if err := is(3, 32, oldToken); err != nil {
			return err
		}
		return is(6, 60, oldToken)
	})
	cell("delete", func() error {
		if err := tab(db).Delete(&Mapped{}, 6).Error; err != nil {
			return err
		}
		if err := tab(db).Where("id = ?", 5).Delete(&Legacy{}).Error; err != nil {
			return err
		}
		if row(5) != nil || row(6) != nil {
			return errors.New("rows 5, 6 still there")
		}
		return nil
	})
	cell("legacy_model", func() error {
		if err := tab(db).Create(&Legacy{ID: 7, Balance: 70}).Error; err != nil {
			return err
		}
		if err := tab(db).Where("id = ?", 7).Updates(Legacy{Balance: 71}).Error; err != nil {
			return err
		}
		return is(7, 71, oldToken)
	})
	cell("savepoint", func() error {
		err := db.Transaction(func(tx *gorm.DB) error {
			if err := tab(tx).Where("id = ?", 1).Update("balance", 11).Error; err != nil {
				return err
			}
			inner := tx.Transaction(func(tx2 *gorm.DB) error { // a savepoint
				if err := tab(tx2).Where("id = ?", 2).Update("balance", 99).Error; err != nil {
					return err
				}
				return errors.New("roll the savepoint back")
			})
			if inner == nil || inner.Error() != "roll the savepoint back" {
				return fmt.Errorf("savepoint: %v", inner)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := is(1, 11, oldToken); err != nil {
			return err
		}
		return is(2, 21, oldToken)
	})
	cell("missing_token", func() error {
		if err := sqlstate("55F02", tab(fresh).Create(&Mapped{ID: 8, Balance: 80}).Error); err != nil {
			return err
		}
		if row(8) != nil {
			return errors.New("row 8 was written")
		}
		return nil
	})
	cell("set_local", func() error {
		err := fresh.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("SET LOCAL fence.token = " + strconv.FormatInt(newToken, 10)).Error; err != nil {
				return err
			}
			var m Mapped
			if err := tab(tx).First(&m, 4).Error; err != nil {
				return err
			}
			m.Balance = 41
			return tab(tx).Save(&m).Error
		})
		if err != nil {
			return err
		}
		return is(4, 41, newToken)
	})
	cell("stale", func() error {
		before := row(4)
		if err := sqlstate("55F01", tab(db).Where("id = ?", 4).Update("balance", 0).Error); err != nil {
			return err
		}
		if err := sqlstate("55F01", tab(db).Delete(&Mapped{}, 4).Error); err != nil {
			return err
		}
		if after := row(4); after == nil || after.balance != before.balance || *after.token != *before.token {
			return fmt.Errorf("row 4 changed to %+v", after)
		}
		return nil
	})
	if failed > 0 {
		os.Exit(1)
	}
}

func cell(name string, f func() error) {
	if err := f(); err != nil {
		failed++
		fmt.Printf("FAIL %s: %v\n", name, err)
		return
	}
	fmt.Printf("ok %s\n", name)
}

func sqlstate(code string, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return fmt.Errorf("error %v, want SQLSTATE %s", err, code)
	}
	if pe.Code != code {
		return fmt.Errorf("SQLSTATE %s, want %s: %s", pe.Code, code, pe.Message)
	}
	return nil
}
